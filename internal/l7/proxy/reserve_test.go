package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestCriticalReserveField: concurrency.critical_reserve is the share of
// max_in_flight only critical requests may use (default 10%): with 0% every
// slot serves default requests, with 50% of 4 only 2 do. Out-of-range values
// are policy errors.
func TestCriticalReserveField(t *testing.T) {
	for _, c := range []struct {
		reserve     string
		max, shared int
	}{{"", 2, 1}, {"0%", 2, 2}, {"50%", 4, 2}} {
		t.Run("reserve="+c.reserve, func(t *testing.T) {
			up := startUpstream(t)
			up.hold = make(chan struct{})
			field := ""
			if c.reserve != "" {
				field = ", critical_reserve: " + c.reserve
			}
			cfg := decodeYAML(t, fmt.Sprintf(`
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      concurrency: {max_in_flight: %d, queue: 0%s}
`, c.max, field), up.srv.URL)
			_, base := startProxy(t, cfg, Options{})
			var wg sync.WaitGroup
			defer wg.Wait()
			defer close(up.hold)
			for i := range c.shared {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := testClient.Get(base + "/slow")
					if err == nil {
						resp.Body.Close()
					}
				}()
				select {
				case <-up.entered:
				case <-time.After(10 * time.Second):
					t.Fatalf("default request %d of %d shared slots never reached the upstream", i+1, c.shared)
				}
			}
			if s := status(t, "GET", base+"/x"); s != http.StatusServiceUnavailable {
				t.Fatalf("a default request past the %d shared slots: %d, want 503", c.shared, s)
			}
		})
	}
	for _, bad := range []string{"100%", "10", "-1%", "ten%"} {
		var doc yaml.Node
		src := "l7:\n  listen: 127.0.0.1:1\n  upstream: http://127.0.0.1:2\n  concurrency: {max_in_flight: 2, critical_reserve: \"" + bad + "\"}\n"
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		_, probs := Decode(l7Node(&doc), "p.yaml")
		if len(probs) != 1 || !strings.Contains(probs[0].String(), "critical_reserve") {
			t.Errorf("critical_reserve %q: problems %v, want one naming critical_reserve", bad, probs)
		}
	}
}
