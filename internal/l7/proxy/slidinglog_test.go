package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// TestSlidingLogLimit: algorithm sliding_log from the policy, through both
// engines: 2 per minute, exact at the window's end, with Retry-After from
// the oldest logged request.
func TestSlidingLogLimit(t *testing.T) {
	up := startUpstream(t)
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			cfg := decodeYAML(t, strings.ReplaceAll(`
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: ENGINE
  routes:
    - name: api
      limits:
        - {name: log, key: ip, rate: 2/min, algorithm: sliding_log}
`, "ENGINE", string(e)), up.srv.URL)
			clock := new(l7test.ManualClock)
			clock.Set(int64(time.Hour))
			_, base := startProxy(t, cfg, Options{Clock: clock})
			get := func() *http.Response {
				resp := do(t, "GET", base+"/x")
				resp.Body.Close()
				return resp
			}
			if c := get().StatusCode; c != 200 {
				t.Fatalf("first: %d", c)
			}
			clock.Advance(20 * time.Second)
			if c := get().StatusCode; c != 200 {
				t.Fatalf("second: %d", c)
			}
			clock.Advance(10 * time.Second)
			resp := get()
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" {
				t.Fatalf("third: %d Retry-After %q, want 429 and 30 (the first request leaves the window in 30s)",
					resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			clock.Advance(30*time.Second - 1)
			if c := get().StatusCode; c != 429 {
				t.Fatalf("1ns before the first leaves: %d, want 429", c)
			}
			clock.Advance(1)
			if c := get().StatusCode; c != 200 {
				t.Fatalf("when the first leaves: %d, want 200", c)
			}
		})
	}
}
