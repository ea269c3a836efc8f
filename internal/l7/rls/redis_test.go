package rls

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestRedisBackend: two rate-limit services (two hosts) share a redis
// limit through a real redis-server; a local limit on the same descriptor
// is refunded when Redis refuses, and Redis is not charged when the local
// limit refuses.
func TestRedisBackend(t *testing.T) {
	rs := testenv.StartRedis(t)
	policy := strings.ReplaceAll(`
l7:
  redis: {addr: REDIS, prefix: "eg:rlstest:"}
  rls:
    listen: 127.0.0.1:0
    rules:
      - name: per-user
        domain: edge
        descriptor: [user_id]
        limits:
          - {name: user-redis, rate: 5/min, algorithm: sliding-window, backend: redis}
          - {name: user-local, rate: 4/min, algorithm: sliding-window}
      - name: per-tenant
        domain: edge
        descriptor: [tenant]
        limits:
          - {name: tenant-redis, rate: 6/min, backend: redis}
          - {name: tenant-shadow, rate: 1/min, backend: redis, shadow: true}
`, "REDIS", rs.Addr())
	a, _ := startServer(t, policy, nil, nil)
	b, _ := startServer(t, policy, nil, nil)
	ca, _ := dial(t, a.Addrs()["grpc"])
	cb, _ := dial(t, b.Addrs()["grpc"])

	// tenant: 6 per minute across both hosts, whichever answers.
	ok := 0
	for i := range 10 {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		res := ask(t, c, "edge", desc("tenant=acme"))
		st := res.GetStatuses()[0]
		if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
			if st.GetCurrentLimit().GetName() != "tenant-redis" || st.GetLimitRemaining() != uint32(6-ok) {
				t.Errorf("request %d: %v, want tenant-redis with %d remaining", i, st, 6-ok)
			}
			continue
		}
		h := headers(res)
		if h["Retry-After"] == "" || !strings.Contains(h["RateLimit"], `"tenant-redis";r=0;t=`) || strings.Contains(h["RateLimit"], "shadow") {
			t.Errorf("request %d refused with headers %v: want Retry-After and tenant-redis r=0, no shadow limit", i, h)
		}
	}
	if ok != 6 {
		t.Errorf("%d of 10 allowed across two hosts, want exactly 6", ok)
	}
	// The shadow limit never refused, and it counted.
	if n := a.Service().rules[1].all[1].counts[cShadowRejected].Load() + b.Service().rules[1].all[1].counts[cShadowRejected].Load(); n == 0 {
		t.Error("the shadow redis limit counted no would-be rejection")
	}

	// user: the local limit (4/min, per host) refuses the 5th on host a
	// before Redis is asked; host b then gets the redis limit's last unit.
	for i := range 4 {
		if res := ask(t, ca, "edge", desc("user_id=u1")); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("user request %d on a: %v", i, res)
		}
	}
	res := ask(t, ca, "edge", desc("user_id=u1"))
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || res.GetStatuses()[0].GetCurrentLimit().GetName() != "user-local" {
		t.Fatalf("5th user request on a: %v, want OVER_LIMIT by user-local", res)
	}
	res = ask(t, cb, "edge", desc("user_id=u1"))
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || res.GetStatuses()[0].GetCurrentLimit().GetName() != "user-redis" ||
		res.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Fatalf("user request on b: %v, want OK with user-redis at 0 remaining (a's refusal took nothing from redis)", res)
	}
	// Redis now refuses on b; b's local limit is refunded (3 left, not 2).
	res = ask(t, cb, "edge", desc("user_id=u1"))
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6th user request: %v, want OVER_LIMIT", res)
	}
	if got := headers(res)["RateLimit"]; !strings.HasPrefix(got, `"user-local";r=3;`) || !strings.Contains(got, `"user-redis";r=0;`) {
		t.Errorf("6th user request: RateLimit %q, want user-local r=3 (refunded) and user-redis r=0", got)
	}

	// hits_addend on both backends: 3 units from each limit.
	hits := func(c rlsv3.RateLimitServiceClient, user string, n uint64) *rlsv3.RateLimitResponse {
		t.Helper()
		res, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: desc("user_id=" + user).Entries, HitsAddend: wrapperspb.UInt64(n)}}})
		if err != nil {
			t.Fatalf("hits_addend %d: %v", n, err)
		}
		return res
	}
	if got := headers(hits(ca, "u9", 3))["RateLimit"]; !strings.HasPrefix(got, `"user-local";r=1;`) || !strings.Contains(got, `"user-redis";r=2;`) {
		t.Errorf("hits_addend 3: RateLimit %q, want user-local r=1 and user-redis r=2", got)
	}
	// Host b takes 4 of u11's redis budget; host a's 2 then fit its local
	// limit but not redis: a's local charge of 2 is given back.
	hits(cb, "u11", 4)
	res = hits(ca, "u11", 2)
	if got := headers(res)["RateLimit"]; res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		!strings.HasPrefix(got, `"user-local";r=4;`) || !strings.Contains(got, `"user-redis";r=1;`) {
		t.Errorf("hits_addend 2 with 1 left in redis: %v %q, want OVER_LIMIT, user-local r=4 (refunded), user-redis r=1", res.GetOverallCode(), got)
	}
	if res := hits(ca, "u11", 1); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("the last unit of u11: %v, want OK", res)
	}

	// Redis down: fail-open by default (the limits' failure policy), the
	// answer still OK, never an error to Envoy.
	rs.Stop()
	res, err := ca.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=other")}})
	if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("redis down, fail-open: %v %v, want OK", res, err)
	}
	t.Log(fmt.Sprintf("two hosts shared 6/min exactly; redis down answered %v", res.GetOverallCode()))
}

// TestHybridBackend: two rate-limit services (two hosts) share one
// `backend: hybrid` limit through a real redis-server: together they
// admit at least the limit and at most limit + (hosts − 1) × lease, each
// mostly from its own lease; hits_addend takes its cost from the lease;
// with Redis down each host limits locally to limit ÷ hosts.
func TestHybridBackend(t *testing.T) {
	rs := testenv.StartRedis(t)
	const limit, hosts, lease = 200, 2, 10 // lease: the default ⌈200 ÷ (10 × 2)⌉
	policy := tenantPolicy(rs, `{addr: REDIS, prefix: "eg:rlshybrid:", hosts: 2, sync_interval: 100ms}`, `{name: tenant-hybrid, rate: 200/h, algorithm: sliding-window, backend: hybrid}`)
	a, _ := startServer(t, policy, nil, nil)
	b, _ := startServer(t, policy, nil, nil)
	ca, _ := dial(t, a.Addrs()["grpc"])
	cb, _ := dial(t, b.Addrs()["grpc"])

	ok := map[int]int{}
	for i := range 300 {
		res := ask(t, []rlsv3.RateLimitServiceClient{ca, cb}[i%2], "edge", desc("tenant=acme"))
		st := res.GetStatuses()[0]
		if st.GetCurrentLimit().GetName() != "tenant-hybrid" || st.GetCurrentLimit().GetRequestsPerUnit() != limit {
			t.Fatalf("request %d: status %v, want the tenant-hybrid limit", i, st)
		}
		if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok[i%2]++
		} else if h := headers(res); h["Retry-After"] == "" || !strings.Contains(h["RateLimit"], `"tenant-hybrid";r=0;`) {
			t.Fatalf("request %d refused with headers %v, want Retry-After and tenant-hybrid r=0", i, h)
		}
	}
	total := ok[0] + ok[1]
	t.Logf("two hosts admitted %d + %d = %d of 300; limit %d, bound %d", ok[0], ok[1], total, limit, limit+(hosts-1)*lease)
	if total < limit || total > limit+(hosts-1)*lease || ok[0] < limit/4 || ok[1] < limit/4 {
		t.Fatalf("two hosts admitted %d / %d, want a total within [%d, %d], each a fair share", ok[0], ok[1], limit, limit+(hosts-1)*lease)
	}

	// hits_addend 3 on a fresh tenant: three units of the lease each time.
	units := 0
	for i := range 80 {
		c := []rlsv3.RateLimitServiceClient{ca, cb}[i%2]
		res, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=bulk")}})
		if err != nil {
			t.Fatalf("hits_addend 3 through hybrid: %v", err)
		}
		if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			units += 3
		}
	}
	t.Logf("hits_addend 3: %d units admitted of 240 offered", units)
	if units < limit-2 || units > limit+(hosts-1)*lease {
		t.Fatalf("hits_addend 3: %d units admitted, want within [%d, %d]", units, limit-2, limit+(hosts-1)*lease)
	}

	// Redis down: host a limits locally to 200 ÷ 2 per hour (failure:
	// local, the hybrid default), with the same headers.
	rs.Stop()
	local := 0
	for range 120 {
		res := ask(t, ca, "edge", desc("tenant=other"))
		if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			local++
		}
	}
	if local != limit/hosts {
		t.Fatalf("redis down: %d of 120 admitted on a fresh tenant, want %d (limit ÷ hosts, locally)", local, limit/hosts)
	}
}

// TestHybridCapacity: an rls rule's hybrid limit keeps at most capacity
// leases (here 4). A spray of 10 × capacity tenants, each asked three
// times in rounds against a rate of 2/h (every request a new key at
// capacity), admits exactly 2 per tenant, and the service exports the
// leases held, the capacity and every eviction.
func TestHybridCapacity(t *testing.T) {
	rs := testenv.StartRedis(t)
	const capacity, tenants, rounds = 4, 40, 3
	policy := tenantPolicy(rs, `{addr: REDIS, prefix: "eg:rlscap:", sync_interval: 100ms}`, `{name: capped, rate: 2/h, algorithm: sliding-window, backend: hybrid, capacity: 4}`)
	srv, _ := startServer(t, policy, nil, nil)
	c, _ := dial(t, srv.Addrs()["grpc"])
	ok := make([]int, tenants)
	for range rounds {
		for i := range tenants {
			if ask(t, c, "edge", desc(fmt.Sprintf("tenant=t%d", i))).GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok[i]++
			}
		}
	}
	for i, n := range ok {
		if n != 2 {
			t.Fatalf("tenant t%d admitted %d of %d, want 2 (the rate) across evictions", i, n, rounds)
		}
	}
	got := hybridGauges(t, srv)
	want := map[string]float64{
		"edgeguard_l7_rls_hybrid_leases/leases":   capacity,
		"edgeguard_l7_rls_hybrid_leases/capacity": capacity,
		"edgeguard_l7_rls_hybrid_evictions_total": tenants*rounds - capacity,
	}
	t.Logf("%d tenants × %d requests at capacity %d: %v", tenants, rounds, capacity, got)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// hybridGauges gathers srv's series, summed by name and "what" label
// (edgeguard_l7_rls_hybrid_leases/leases, .../capacity).
func hybridGauges(t *testing.T, srv *Server) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "what" {
					name += "/" + lp.GetValue()
				}
			}
			got[name] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return got
}

// TestHybridTiers: an rls rule's `backend: hybrid` limit is decided in the
// base set's limiter and in each tier's with hybrid limits of its own
// (three here), with one lease state on the host (one map of capacity
// leases, not one per limiter). One host at hosts: 1, one tenant
// alternating its plan (the tier entry; an unknown plan is decided by the
// base set): the rule counts per descriptor value, the plan included, so
// each (tenant, plan) is admitted exactly the limit, and no limiter takes
// another's counts for a foreign host's (no warning).
func TestHybridTiers(t *testing.T) {
	rs := testenv.StartRedis(t)
	const limit, capacity, perPlan = 200, 16, 250
	policy := strings.ReplaceAll(`
l7:
  redis: {addr: REDIS, prefix: "eg:rlstiers:", sync_interval: 100ms}
  rls:
    listen: 127.0.0.1:0
    rules:
      - name: per-tenant
        domain: edge
        descriptor: [tenant, plan]
        limits: [{name: tenant-hybrid, rate: 200/h, algorithm: sliding-window, backend: hybrid, capacity: 16}]
        tiers:
          entry: plan
          levels:
            free: [{name: free-h, rate: 1000/h, algorithm: sliding-window, backend: hybrid}]
            pro: [{name: pro-h, rate: 2000/h, algorithm: sliding-window, backend: hybrid}]
`, "REDIS", rs.Addr())
	_, cfg := decodeL7(t, policy)
	logs := &testenv.SyncBuffer{}
	srv := NewServer(ServerOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	t.Cleanup(srv.Close)
	ch, err := srv.Prepare(cfg)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	ch.Commit()
	// Foreign counts are counted once a limiter has run two sync
	// intervals (redislimit's TestHybridSingleHostRestart).
	time.Sleep(250 * time.Millisecond)
	plans := []string{"basic", "free", "pro"}
	admitted := map[string]int{}
	for i := range perPlan * len(plans) {
		plan := plans[i%len(plans)]
		v, err := srv.Service().Decide(context.Background(), &Request{Domain: "edge",
			Descriptors: []Descriptor{{Entries: []Entry{{"tenant", "acme"}, {"plan", plan}}}}})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if v.Allowed {
			admitted[plan]++
		}
	}
	time.Sleep(250 * time.Millisecond) // the background flush reports the last admissions
	got := hybridGauges(t, srv)
	t.Logf("one host, three sets' limiters, one tenant alternating plans: admitted %v (limit %d each); leases %v, capacity %v",
		admitted, limit, got["edgeguard_l7_rls_hybrid_leases/leases"], got["edgeguard_l7_rls_hybrid_leases/capacity"])
	for _, plan := range plans {
		if admitted[plan] != limit {
			t.Fatalf("plan %s admitted %d of %d, want the limit %d", plan, admitted[plan], perPlan, limit)
		}
	}
	if strings.Contains(logs.String(), "hosts is 1 but another host") {
		t.Fatalf("one host warned of another host's counts; log:\n%s", logs)
	}
	// tenant-hybrid: one map (3 keys) of capacity 16; free-h and pro-h: one
	// key each, of the default capacity.
	if c, want := got["edgeguard_l7_rls_hybrid_leases/capacity"], float64(capacity+2*proxy.DefaultLocalCapacity); c != want {
		t.Fatalf("hybrid lease capacity %v, want %v (tenant-hybrid's one map of %d, free-h's and pro-h's)", c, want, capacity)
	}
	if n := got["edgeguard_l7_rls_hybrid_leases/leases"]; n != 5 {
		t.Fatalf("%v hybrid leases, want 5 (tenant-hybrid: three keys; free-h, pro-h: one each)", n)
	}
}

// tenantPolicy is an l7 section with redis (REDIS: rs's address) and one
// rls rule, per-tenant (domain edge, descriptor tenant), of one limit.
func tenantPolicy(rs *testenv.Redis, redis, limit string) string {
	return strings.ReplaceAll("l7:\n  redis: "+redis+"\n  rls:\n    listen: 127.0.0.1:0\n    rules:\n      - name: per-tenant\n"+
		"        domain: edge\n        descriptor: [tenant]\n        limits:\n          - "+limit+"\n", "REDIS", rs.Addr())
}
