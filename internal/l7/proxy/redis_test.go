package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func TestRedisBackedRules(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  redis: {addr: `+srv.Addr()+`, timeout: 200ms, prefix: "eg:test:", failure: fail-open}
  routes:
    - name: closed
      match: {path_prefix: /closed}
      limits:
        - {name: local-ip, key: ip, rate: 100/min}
        - {name: r-closed, key: "header:X-API-Key", rate: 2/min, backend: redis, failure: fail-closed}
    - name: open
      match: {path_prefix: /open}
      limits:
        - {name: r-open, key: "header:X-API-Key", rate: 1/min, backend: redis, algorithm: sliding-window}
        - {name: r-shadow, key: ip, rate: 1/min, backend: redis, shadow: true}
`, up.srv.URL)
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Registerer: reg})
	key := func(k string) reqOpt { return withHeader("X-API-Key", k) }

	for i := range 2 {
		if s := status(t, "GET", base+"/closed", key("k1")); s != 200 {
			t.Fatalf("k1 #%d: %d", i, s)
		}
	}
	resp := do(t, "GET", base+"/closed", key("k1"))
	mustRefuse(t, resp, "k1 #3", "r-closed")
	if ra := resp.Header.Get("Retry-After"); ra != "30" && ra != "29" {
		t.Fatalf("Retry-After %q, want about 30 (GCRA 2/min, Redis clock)", ra)
	}
	if s := status(t, "GET", base+"/closed", key("k2")); s != 200 {
		t.Fatalf("k2: %d, want 200 (its own key)", s)
	}
	if s := status(t, "GET", base+"/closed"); s != 200 {
		t.Fatalf("no API key: %d, want 200 (the rule does not apply)", s)
	}
	// The state lives in Redis under the prefix, keyed by the readable key.
	c := srv.Client(t)
	keys, err := c.Keys(context.Background(), "eg:test:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(keys, " ")
	if !strings.Contains(joined, "x-api-key=k1") || !strings.Contains(joined, "r-closed") {
		t.Fatalf("redis keys %v: want the k1 key of r-closed", keys)
	}

	if s := status(t, "GET", base+"/open", key("k1")); s != 200 {
		t.Fatalf("open k1 #1: %d", s)
	}
	if s := status(t, "GET", base+"/open", key("k1")); s != 429 {
		t.Fatalf("open k1 #2: %d, want 429", s)
	}
	if s := status(t, "GET", base+"/open", key("k3")); s != 200 {
		t.Fatalf("open k3: %d, want 200: the shadow ip rule never rejects", s)
	}
	got := gather(t, reg)
	if v := got[`rate_limit_shadow_would_reject_total{layer="l7_redis",rule="r-shadow"}`]; v < 1 {
		t.Fatalf("shadow would-reject %v, want >= 1", v)
	}
	if v := got[`rate_limit_rejected_total{layer="l7_redis",reason="quota_exceeded",rule="r-closed"}`]; v != 1 {
		t.Fatalf("r-closed rejections %v, want 1", v)
	}
	for _, lim := range []string{"closed:header:X-Api-Key", "open:header:X-Api-Key", "open:ip:shadow"} {
		if v, ok := got[`edgeguard_l7_redis_breaker_state{limiter="`+lim+`"}`]; !ok || v != 0 {
			t.Fatalf("breaker state of %s: %v (present %v), want 0 (closed); series %v", lim, v, ok, keysWith(got, "breaker_state"))
		}
	}

	// Redis goes away: each rule's failure policy answers.
	srv.Stop()
	if s := status(t, "GET", base+"/open", key("k1")); s != 200 {
		t.Fatalf("fail-open with Redis down: %d, want 200", s)
	}
	resp = do(t, "GET", base+"/closed", key("k9"))
	mustRefuse(t, resp, "fail-closed with Redis down", "r-closed")
	if s := status(t, "GET", base+"/closed"); s != 200 {
		t.Fatalf("no API key with Redis down: %d, want 200", s)
	}
	// A fail-closed refusal without Redis is not a quota: its own reason.
	got = gather(t, reg)
	if v := got[`rate_limit_rejected_total{layer="l7_redis",reason="redis_unavailable",rule="r-closed"}`]; v != 1 {
		t.Errorf("r-closed refusals without redis %v, want 1 (reason redis_unavailable)", v)
	}
	if v := got[`rate_limit_rejected_total{layer="l7_redis",reason="quota_exceeded",rule="r-closed"}`]; v != 1 {
		t.Errorf("r-closed quota refusals %v, want still 1", v)
	}
	// Open the breaker (3 failed round trips) and let one probe fail, so
	// that it backs off (1 s) when Redis comes back.
	down := 1
	for range 3 {
		if s := status(t, "GET", base+"/closed", key("k9")); s != 429 {
			t.Fatalf("fail-closed with Redis down: %d", s)
		}
		down++
	}
	time.Sleep(600 * time.Millisecond)
	status(t, "GET", base+"/closed", key("k9")) // starts the probe, which fails
	down++
	time.Sleep(100 * time.Millisecond)
	// Redis comes back: the breaker's backoff keeps refusing for at most
	// MaxOpenFor + ProbeTimeout (5 s + 250 ms with the defaults,
	// docs/l7-redis.md), every refusal counted as redis_unavailable.
	srv.Restart()
	back := time.Now()
	refused := 0
	for status(t, "GET", base+"/closed", key(fmt.Sprintf("r%d", refused))) == 429 {
		refused++
		if time.Since(back) > 5250*time.Millisecond+2*time.Second {
			t.Fatalf("fail-closed still refuses %v after redis came back", time.Since(back))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("fail-closed refused %d requests for %v after redis came back", refused, time.Since(back).Round(time.Millisecond))
	got = gather(t, reg)
	if refused == 0 {
		t.Errorf("no refusal after redis came back: the breaker did not back off (the test did not open it)")
	}
	if v := got[`rate_limit_rejected_total{layer="l7_redis",reason="redis_unavailable",rule="r-closed"}`]; v != float64(down+refused) {
		t.Errorf("r-closed refusals without redis %v, want %d", v, down+refused)
	}
	if v := got[`rate_limit_rejected_total{layer="l7_redis",reason="quota_exceeded",rule="r-closed"}`]; v != 1 {
		t.Errorf("r-closed quota refusals %v, want still 1", v)
	}
}

func mustStatus(t *testing.T, resp *http.Response, want int, what string) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s: status %d, want %d (headers %v)", what, resp.StatusCode, want, resp.Header)
	}
}

// mustRefuse fails unless resp is a 429 whose problem names exactly the
// violated limits, in order.
func mustRefuse(t *testing.T, resp *http.Response, what string, violated ...string) {
	t.Helper()
	mustStatus(t, resp, 429, what)
	if p := problemOf(t, resp); !slices.Equal(p.ViolatedPolicies, violated) {
		t.Fatalf("%s: violated %v, want %v", what, p.ViolatedPolicies, violated)
	}
}

// oneOf fails unless got is one of want (Redis decides on its own clock:
// a second may tick between two requests).
func oneOf(t *testing.T, what, got string, want ...string) {
	t.Helper()
	if !slices.Contains(want, got) {
		t.Fatalf("%s: %q, want one of %q", what, got, want)
	}
}

// TestAllOrNothingAcrossBackends: a request the local limits admit and a
// Redis limit refuses keeps no local charge; a request one Redis group
// refuses keeps no charge in the group that admitted it; the headers of
// 200 and 429 describe both backends' limits; Retry-After is the longest
// wait over every refused limit.
func TestAllOrNothingAcrossBackends(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  redis: {addr: `+srv.Addr()+`, timeout: 500ms, prefix: "eg:aon:"}
  routes:
    - name: mixed
      match: {path_prefix: /mixed}
      limits:
        - {name: local-ip, key: ip, rate: 3/min}
        - {name: r-key, key: "header:X-API-Key", rate: 1/min, backend: redis}
    - name: groups
      match: {path_prefix: /groups}
      limits:
        - {name: r-ip, key: ip, rate: 2/min, backend: redis}
        - {name: r-user, key: "header:X-API-Key", rate: 1/min, backend: redis}
        - {name: r-watch, key: ip, rate: 1/min, backend: redis, shadow: true}
`, up.srv.URL)
	clock := new(l7test.ManualClock)
	_, base := startProxy(t, cfg, Options{Clock: clock})
	key := func(k string) reqOpt { return withHeader("X-API-Key", k) }

	// Local admits, Redis refuses: the local charge is given back.
	resp := do(t, "GET", base+"/mixed", key("k1"))
	mustStatus(t, resp, 200, "mixed k1 #1")
	wantHeaderIs(t, resp, "RateLimit-Policy", `"local-ip";q=3;w=60, "r-key";q=1;w=60`)
	wantHeaderIs(t, resp, "RateLimit", `"local-ip";r=2;t=20, "r-key";r=0;t=60`)
	for i := range 5 {
		resp = do(t, "GET", base+"/mixed", key("k1"))
		mustRefuse(t, resp, fmt.Sprintf("mixed k1 #%d", i+2), "r-key")
		wantHeaderIs(t, resp, "RateLimit-Policy", `"local-ip";q=3;w=60, "r-key";q=1;w=60`)
		oneOf(t, "RateLimit on a Redis 429", resp.Header.Get("RateLimit"),
			`"local-ip";r=2;t=20, "r-key";r=0;t=60`, `"local-ip";r=2;t=20, "r-key";r=0;t=59`)
		oneOf(t, "Retry-After", resp.Header.Get("Retry-After"), "60", "59")
	}
	// The local quota is what k1's first request left: two more.
	mustStatus(t, do(t, "GET", base+"/mixed", key("k2")), 200, "mixed k2")
	mustStatus(t, do(t, "GET", base+"/mixed", key("k3")), 200, "mixed k3")
	resp = do(t, "GET", base+"/mixed", key("k4"))
	mustRefuse(t, resp, "mixed k4 (local quota spent)", "local-ip")
	wantHeaderIs(t, resp, "Retry-After", "20")
	// Redis was not asked: k4's own quota is untouched.
	clock.Advance(20 * time.Second)
	mustStatus(t, do(t, "GET", base+"/mixed", key("k4")), 200, "mixed k4 after the local wait")

	// Two Redis groups, the second refuses: the first keeps no charge.
	resp = do(t, "GET", base+"/groups", key("u1"))
	mustStatus(t, resp, 200, "groups u1 #1")
	wantHeaderIs(t, resp, "RateLimit-Policy", `"r-ip";q=2;w=60, "r-user";q=1;w=60`)
	for i := range 4 {
		resp = do(t, "GET", base+"/groups", key("u1"))
		mustRefuse(t, resp, fmt.Sprintf("groups u1 #%d", i+2), "r-user")
		oneOf(t, "RateLimit after a refund", resp.Header.Get("RateLimit"),
			`"r-ip";r=1;t=30, "r-user";r=0;t=60`, `"r-ip";r=1;t=29, "r-user";r=0;t=60`,
			`"r-ip";r=1;t=30, "r-user";r=0;t=59`, `"r-ip";r=1;t=29, "r-user";r=0;t=59`)
	}
	mustStatus(t, do(t, "GET", base+"/groups", key("u2")), 200, "groups u2: r-ip kept one unit for it")
	// Both groups refuse now: Retry-After is the longer wait (r-user's).
	resp = do(t, "GET", base+"/groups", key("u1"))
	mustRefuse(t, resp, "groups u1 with both groups spent", "r-ip", "r-user")
	oneOf(t, "Retry-After over both groups", resp.Header.Get("Retry-After"), "60", "59", "58")
	resp = do(t, "GET", base+"/groups", key("u3"))
	mustRefuse(t, resp, "groups u3: r-ip spent", "r-ip")
	if ra := resp.Header.Get("Retry-After"); ra > "30" || len(ra) != 2 {
		t.Fatalf("Retry-After %q: want about 30 (r-ip alone)", ra)
	}
}

// TestTiersWithRedisLimits: a tier's redis limits apply to its requests,
// grouped with the route's redis limits of the same key.
func TestTiersWithRedisLimits(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  redis: {addr: `+srv.Addr()+`, timeout: 500ms, prefix: "eg:tiers:"}
  routes:
    - name: api
      limits:
        - {name: route-r, key: "header:X-API-Key", rate: 10/min, backend: redis}
      tiers:
        header: X-Plan
        default: free
        levels:
          free: [{name: free-r, key: "header:X-API-Key", rate: 1/min, backend: redis}]
          pro:
            - {name: pro-local, key: ip, rate: 100/min}
            - {name: pro-r, key: "header:X-API-Key", rate: 3/min, backend: redis}
            - {name: pro-shadow, key: ip, rate: 1/min, backend: redis, shadow: true}
`, up.srv.URL)
	_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})
	count := func(plan, k string) int {
		n := 0
		for range 5 {
			if status(t, "GET", base+"/", withHeader("X-Plan", plan), withHeader("X-API-Key", k)) == 200 {
				n++
			}
		}
		return n
	}
	if n := count("pro", "kp"); n != 3 {
		t.Fatalf("pro admitted %d of 5, want 3 (pro-r; the shadow rule never rejects)", n)
	}
	if n := count("free", "kf"); n != 1 {
		t.Fatalf("free admitted %d of 5, want 1", n)
	}
	if n := count("unknown", "ku"); n != 1 {
		t.Fatalf("unknown plan (default free) admitted %d of 5, want 1", n)
	}
	resp := do(t, "GET", base+"/", withHeader("X-Plan", "pro"), withHeader("X-API-Key", "kp2"))
	mustStatus(t, resp, 200, "pro kp2")
	wantHeaderIs(t, resp, "RateLimit-Policy", `"pro-local";q=100;w=60, "route-r";q=10;w=60, "pro-r";q=3;w=60`)
	// route-r is shared by every tier: kp's refused requests did not
	// charge it, its three admitted ones did.
	resp = do(t, "GET", base+"/", withHeader("X-Plan", "free"), withHeader("X-API-Key", "kp"))
	mustStatus(t, resp, 200, "kp in the free tier")
	oneOf(t, "route-r after 4 admitted", resp.Header.Get("RateLimit"),
		`"route-r";r=6;t=24, "free-r";r=0;t=60`, `"route-r";r=6;t=23, "free-r";r=0;t=59`,
		`"route-r";r=6;t=24, "free-r";r=0;t=59`, `"route-r";r=6;t=23, "free-r";r=0;t=60`)
}

func wantHeaderIs(t *testing.T, resp *http.Response, name, want string) {
	t.Helper()
	if got := resp.Header.Get(name); got != want {
		t.Fatalf("%s: %q, want %q", name, got, want)
	}
}
