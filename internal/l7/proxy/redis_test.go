package proxy

import (
	"context"
	"slices"
	"strings"
	"testing"

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
	if p := problemOf(t, resp); resp.StatusCode != 429 || !slices.Equal(p.ViolatedPolicies, []string{"r-closed"}) {
		t.Fatalf("k1 #3: %d %v, want 429 [r-closed]", resp.StatusCode, p.ViolatedPolicies)
	}
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
	if p := problemOf(t, resp); resp.StatusCode != 429 || !slices.Equal(p.ViolatedPolicies, []string{"r-closed"}) {
		t.Fatalf("fail-closed with Redis down: %d %v, want 429 [r-closed]", resp.StatusCode, p.ViolatedPolicies)
	}
	if s := status(t, "GET", base+"/closed"); s != 200 {
		t.Fatalf("no API key with Redis down: %d, want 200", s)
	}
}
