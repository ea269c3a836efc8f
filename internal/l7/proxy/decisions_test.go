package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRequestsByRouteAndDecision: edgeguard_l7_requests_total counts each
// request once per route and decision (allowed, limited, shed, escalated;
// unmatched and exempt requests under their own labels), under both
// engines, and Decisions reports the same counts.
func TestRequestsByRouteAndDecision(t *testing.T) {
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			up := startUpstream(t)
			cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  exempt_paths: [/healthz]
  escalation: {enabled: true, rejections: 2, window: 1m, ttl: 10m}
  routes:
    - name: api
      match: {path_prefix: /api}
      limits: [{name: per-ip, key: ip, rate: 1/h, burst: 1}]
    - name: slow
      match: {path_prefix: /slow}
      concurrency: {max_in_flight: 1, queue: 0, critical_reserve: 0%}
`, up.srv.URL)
			cfg.Engine = engine
			reg := prometheus.NewRegistry()
			clock := new(l7test.ManualClock)
			clock.Set(1e12)
			rec := &recordingEscalator{calls: make(chan escalationCall, 16)}
			p, base := startProxy(t, cfg, Options{Registerer: reg, Clock: clock, Escalator: rec})
			want := map[string]int{}
			check := func(path string, code int, key string) {
				t.Helper()
				if c := status(t, "GET", base+path); c != code {
					t.Fatalf("%s: %d, want %d", path, c, code)
				}
				want[key]++
			}
			check("/api/a", 200, "api allowed")
			check("/api/a", 429, "api limited")
			check("/api/a", 429, "api limited")
			check("/api/a", 429, "api escalated") // the third rejection passes the threshold of 2
			check("/other", 200, "(unmatched) allowed")
			check("/healthz", 200, "(exempt) allowed")

			for len(up.entered) > 0 { // the requests above
				<-up.entered
			}
			up.hold = make(chan struct{})
			var wg sync.WaitGroup
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
				t.Fatal("the held request never reached the upstream")
			}
			check("/slow", http.StatusServiceUnavailable, "slow shed")
			close(up.hold)
			wg.Wait()
			want["slow allowed"]++

			got := gather(t, reg)
			for _, route := range []string{"api", "slow", "(unmatched)", "(exempt)"} {
				for _, d := range []string{"allowed", "limited", "shed", "escalated"} {
					series := `edgeguard_l7_requests_total{decision="` + d + `",route="` + route + `"}`
					if v := got[series]; int(v) != want[route+" "+d] {
						t.Errorf("%s = %v, want %d", series, v, want[route+" "+d])
					}
				}
			}
			ds := p.Decisions()
			if ds[0].Route != "api" || ds[0].Allowed != 1 || ds[0].Limited != 2 || ds[0].Escalated != 1 || ds[1].Shed != 1 {
				t.Errorf("Decisions %+v", ds)
			}
		})
	}
}
