package proxy

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestHybridBackend: two proxies (two hosts) share one `backend: hybrid`
// limit through a real redis-server. Together they admit at least the
// limit and at most limit + (hosts − 1) × lease; the counts reach Redis (a
// third host started afterwards refuses the key at once); with Redis down
// each host limits locally to limit ÷ hosts (failure: local, the hybrid
// default).
func TestHybridBackend(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	const limit, hosts = 200, 2
	lease := int64(limit / (10 * hosts)) // the default: ⌈200 ÷ 20⌉
	cfg := apiRouteConfig(t, up, `{addr: `+srv.Addr()+`, prefix: "eg:hybrid:", hosts: 2, sync_interval: 100ms}`, `{name: shared, key: "header:X-API-Key", rate: 200/h, algorithm: sliding-window, backend: hybrid}`)
	if l := cfg.Routes[0].Limits[0]; l.Failure != FailureLocal || HybridLease(l, cfg.Redis.Hosts) != lease {
		t.Fatalf("decoded %+v: want failure local and lease %d by default", l, lease)
	}
	regA := prometheus.NewRegistry()
	_, a := startProxy(t, cfg, Options{Registerer: regA})
	_, b := startProxy(t, cfg, Options{Registerer: prometheus.NewRegistry()})
	key := func(k string) reqOpt { return withHeader("X-API-Key", k) }

	admitted := map[string]int{}
	for i := range 300 {
		base := a
		if i%2 == 1 {
			base = b
		}
		resp := do(t, "GET", base+"/x", key("k1"))
		switch resp.StatusCode {
		case 200:
			admitted[base]++
		case 429:
			if resp.Header.Get("Retry-After") == "" {
				t.Fatalf("request %d: 429 without Retry-After", i)
			}
		default:
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	total := admitted[a] + admitted[b]
	t.Logf("two hosts admitted %d + %d = %d of 300; limit %d, bound %d", admitted[a], admitted[b], total, limit, limit+(hosts-1)*int(lease))
	if total < limit || total > limit+(hosts-1)*int(lease) {
		t.Fatalf("two hosts admitted %d, want within [%d, %d]", total, limit, limit+(hosts-1)*int(lease))
	}
	if admitted[a] < limit/4 || admitted[b] < limit/4 {
		t.Fatalf("unfair split %d / %d", admitted[a], admitted[b])
	}
	if v := gather(t, regA)[`edgeguard_l7_redis_hybrid_local_decisions_total{limiter="api:header:X-Api-Key",rule="shared",verdict="allow"}`]; v < 50 {
		t.Fatalf("host a decided %v allowed requests from its lease, want most of its %d", v, admitted[a])
	}
	// The counts reach Redis within sync_interval: a third host refuses k1
	// without having admitted anything itself.
	time.Sleep(300 * time.Millisecond)
	_, c := startProxy(t, cfg, Options{Registerer: prometheus.NewRegistry()})
	if s := status(t, "GET", c+"/x", key("k1")); s != 429 {
		t.Fatalf("a third host on k1: %d, want 429 (the shared window is full)", s)
	}

	// Redis down: each host limits locally to 200 ÷ 2 = 100 per hour.
	srv.Stop()
	local := 0
	for range 120 {
		switch s := status(t, "GET", a+"/x", key("k2")); s {
		case 200:
			local++
		case 429:
		default:
			t.Fatalf("redis down: status %d", s)
		}
	}
	if local != limit/hosts {
		t.Fatalf("redis down: host a admitted %d of 120 on a fresh key, want %d (limit ÷ hosts, locally)", local, limit/hosts)
	}
	if v := gather(t, regA)[`edgeguard_l7_redis_fallback_decisions_total{limiter="api:header:X-Api-Key",policy="degrade",rule="shared",verdict="allow"}`]; v != float64(limit/hosts) {
		t.Fatalf("fallback allow decisions %v, want %d", v, limit/hosts)
	}
}

// TestHybridHostsLeftAtOne: two proxies share a `backend: hybrid` limit with
// l7.redis.hosts left at its default, 1. Each decides from the window as if
// alone only until a sync shows it the other's counts, then with fixed
// grants: together they admit at most limit + (hosts − 1) × ⌈count ÷ 4⌉
// (the single host's default lease) in the window, not hosts × limit, and
// both count what they found in edgeguard_l7_redis_hybrid_foreign_counts_total.
func TestHybridHostsLeftAtOne(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	const limit, hosts, offered = 200, 2, 500
	cfg := apiRouteConfig(t, up, `{addr: `+srv.Addr()+`, prefix: "eg:hybrid1:", sync_interval: 100ms}`, `{name: shared, key: "header:X-API-Key", rate: 200/h, algorithm: sliding-window, backend: hybrid}`)
	lease := HybridLease(cfg.Routes[0].Limits[0], cfg.Redis.Hosts)
	if cfg.Redis.Hosts > 1 || lease != (limit+3)/4 {
		t.Fatalf("decoded hosts %d, lease %d: want the defaults 1 and ⌈%d ÷ 4⌉", cfg.Redis.Hosts, lease, limit)
	}
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	_, a := startProxy(t, cfg, Options{Registerer: regs[0]})
	_, b := startProxy(t, cfg, Options{Registerer: regs[1]})
	// A host counts (and warns of) another's counts once its limiter has
	// run two sync intervals: before, they may be a replaced limiter's
	// (a reload's) late flush.
	time.Sleep(250 * time.Millisecond)
	total := 0
	for i := range offered {
		base := a
		if i%2 == 1 {
			base = b
		}
		switch s := status(t, "GET", base+"/x", withHeader("X-API-Key", "k1")); s {
		case 200:
			total++
		case 429:
		default:
			t.Fatalf("request %d: status %d", i, s)
		}
	}
	bound := limit + (hosts-1)*int(lease)
	t.Logf("two hosts at hosts: 1 admitted %d of %d; limit %d, bound %d (each deciding as if alone: %d)", total, offered, limit, bound, hosts*limit)
	if total < limit || total > bound {
		t.Fatalf("two hosts at hosts: 1 admitted %d, want within [%d, %d]", total, limit, bound)
	}
	for i, reg := range regs {
		if v := gather(t, reg)[`edgeguard_l7_redis_hybrid_foreign_counts_total{limiter="api:header:X-Api-Key",rule="shared"}`]; v == 0 {
			t.Fatalf("host %d found no foreign counts, with the other host writing the key", i)
		}
	}
}

// The default lease: a tenth of the rate's count shared by the hosts, but a
// single host's is the count itself (it decides from the window; the lease
// bounds only what a crash loses); an explicit lease wins.
func TestHybridLeaseDefault(t *testing.T) {
	for _, tc := range []struct {
		count, lease, hosts, want int64
	}{
		{count: 2, hosts: 1, want: 1},
		{count: 6000, hosts: 1, want: 1500},
		{count: 6001, hosts: 1, want: 1501},
		{count: 6000, hosts: 4, want: 150},
		{count: 2, hosts: 2, want: 1},
		{count: 200, hosts: 2, want: 10},
		{count: 6000, lease: 7, hosts: 1, want: 7},
		{count: 6000, lease: 7, hosts: 4, want: 7},
	} {
		if got := HybridLease(Limit{Count: tc.count, Lease: tc.lease}, tc.hosts); got != tc.want {
			t.Errorf("count %d, lease %d, hosts %d: lease %d, want %d", tc.count, tc.lease, tc.hosts, got, tc.want)
		}
	}
}

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
	cfg := apiRouteConfig(t, up, `{addr: `+srv.Addr()+`, prefix: "eg:hybridcap:", sync_interval: 100ms}`, `{name: capped, key: "header:X-API-Key", rate: 2/h, algorithm: sliding-window, backend: hybrid, capacity: 4}`, `{name: default, key: "header:X-API-Key", rate: 1000/h, algorithm: sliding-window, backend: hybrid}`)
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

// apiRouteConfig decodes an l7 section with redis and one route, api, of
// limits (flow maps), in front of up.
func apiRouteConfig(t *testing.T, up *upstream, redis string, limits ...string) *Config {
	t.Helper()
	src := "l7:\n  listen: 127.0.0.1:0\n  upstream: UPSTREAM\n  redis: " + redis + "\n  routes:\n    - name: api\n      limits:\n"
	for _, l := range limits {
		src += "        - " + l + "\n"
	}
	return decodeYAML(t, src, up.srv.URL)
}

// TestHybridTiersOneHost: a route's `backend: hybrid` limit is decided in
// the route's limiter and in each tier's that has redis limits of its own
// (three here), with one lease state on the host: a client alternating its
// tier (X-Plan: none, free, pro) on one host at hosts: 1 is admitted
// exactly the limit, and no limiter takes another's counts for a foreign
// host's (no foreign counts, no warning). With a lease state per limiter
// each would see the others' counts as another host's, and admit up to
// limit + 2 × lease. With Redis down, the limit's local fallback is one
// too: the limit on a fresh key, not one limit per limiter.
func TestHybridTiersOneHost(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	const limit, offered = 200, 450
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  redis: {addr: `+srv.Addr()+`, prefix: "eg:hybridtiers:", sync_interval: 100ms}
  routes:
    - name: api
      limits:
        - {name: shared, key: "header:X-API-Key", rate: 200/h, algorithm: sliding-window, backend: hybrid}
      tiers:
        header: X-Plan
        levels:
          free: [{name: free-h, key: "header:X-API-Key", rate: 1000/h, algorithm: sliding-window, backend: hybrid}]
          pro: [{name: pro-h, key: "header:X-API-Key", rate: 2000/h, algorithm: sliding-window, backend: hybrid}]
`, up.srv.URL)
	logs := &testenv.SyncBuffer{}
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	// Foreign counts are counted once a limiter has run two sync
	// intervals (TestHybridHostsLeftAtOne).
	time.Sleep(250 * time.Millisecond)
	// alternate offers key's requests, the plan alternating (none, free,
	// pro), and counts those admitted.
	alternate := func(key string) int {
		n := 0
		for i := range offered {
			opts := []reqOpt{withHeader("X-API-Key", key)}
			if p := []string{"", "free", "pro"}[i%3]; p != "" {
				opts = append(opts, withHeader("X-Plan", p))
			}
			switch s := status(t, "GET", base+"/x", opts...); s {
			case 200:
				n++
			case 429:
			default:
				t.Fatalf("%s, request %d: status %d", key, i, s)
			}
		}
		return n
	}
	admitted := alternate("k1")
	// Let the background flush report the last admissions.
	time.Sleep(250 * time.Millisecond)
	foreign := 0.0
	for series, v := range gather(t, reg) {
		if strings.HasPrefix(series, "edgeguard_l7_redis_hybrid_foreign_counts_total{") {
			foreign += v
		}
	}
	lease := HybridLease(cfg.Routes[0].Limits[0], cfg.Redis.Hosts)
	t.Logf("one host, three tiers' limiters: %d admitted of %d (limit %d; a lease state per limiter: up to %d), %.0f foreign counts",
		admitted, offered, limit, limit+2*int(lease), foreign)
	if admitted != limit {
		t.Fatalf("one host admitted %d alternating tiers, want the limit %d", admitted, limit)
	}
	if foreign != 0 || strings.Contains(logs.String(), "hosts is 1 but another host") {
		t.Fatalf("one host found %.0f foreign counts across its tiers' limiters; log:\n%s", foreign, logs)
	}

	// Redis down: the limit's local fallback (failure: local) is one too,
	// rate ÷ hosts on a fresh key whatever tier decides.
	srv.Stop()
	local := alternate("k2")
	t.Logf("redis down: %d admitted locally of %d alternating tiers (limit ÷ hosts %d)", local, offered, limit)
	if local != limit {
		t.Fatalf("redis down: %d admitted alternating tiers, want %d (the limit's one local fallback)", local, limit)
	}
}
