package proxy

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestHybridCapacity: a `backend: hybrid` limit's capacity caps the leases
// a host keeps (the rule's Hybrid.Capacity; 65,536 when unset). A spray of
// 10 × capacity distinct keys, each asked three times in rounds against a
// rate of 2/h (every request a new key at capacity: its lease was evicted
// meanwhile), admits exactly 2 per key, and every request after the first
// capacity counts one eviction.
func TestHybridCapacity(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	const capacity, keys, rounds = 4, 40, 3
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  redis: {addr: `+srv.Addr()+`, prefix: "eg:hybridcap:", sync_interval: 100ms}
  routes:
    - name: api
      limits:
        - {name: capped, key: "header:X-API-Key", rate: 2/h, algorithm: sliding-window, backend: hybrid, capacity: 4}
        - {name: default, key: "header:X-API-Key", rate: 1000/h, algorithm: sliding-window, backend: hybrid}
`, up.srv.URL)
	for i, want := range []int{capacity, DefaultLocalCapacity} {
		r, err := RedisRule(cfg.Routes[0].Limits[i], cfg.Redis)
		if err != nil || r.Hybrid == nil || r.Hybrid.Capacity != want {
			t.Fatalf("limit %d: rule %+v (%v), want Hybrid.Capacity %d", i, r.Hybrid, err, want)
		}
	}
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Registerer: reg})
	admitted := make([]int, keys)
	for range rounds {
		for k := range keys {
			switch s := status(t, "GET", base+"/x", withHeader("X-API-Key", fmt.Sprintf("src-%d", k))); s {
			case 200:
				admitted[k]++
			case 429:
			default:
				t.Fatalf("key %d: status %d", k, s)
			}
		}
	}
	for k, n := range admitted {
		if n != 2 {
			t.Fatalf("key src-%d admitted %d of %d, want 2 (the rate) across evictions", k, n, rounds)
		}
	}
	m := gather(t, reg)
	ev := m[`edgeguard_l7_redis_hybrid_evictions_total{limiter="api:header:X-Api-Key",rule="capped"}`]
	t.Logf("%d keys × %d requests at capacity %d: %.0f evictions of the capped limit's leases, %.0f of the default's",
		keys, rounds, capacity, ev, m[`edgeguard_l7_redis_hybrid_evictions_total{limiter="api:header:X-Api-Key",rule="default"}`])
	if want := float64(keys*rounds - capacity); ev != want {
		t.Fatalf("%.0f evictions, want %.0f (every request after the first %d is a new key at capacity)", ev, want, capacity)
	}
}
