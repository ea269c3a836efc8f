package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHybridStatesShared: two limiters given one HybridStates (a route's
// limit built into the route's limiter and a tier's, where it is the
// second rule) decide the limit with one lease state: a key alternating
// between them is admitted exactly the limit on one host at Share 1,
// neither takes the other's counts for another host's, and Redis counts
// what was admitted. Only the first open user flushes the state in the
// background and reports its leases; Close of it leaves the leases to the
// other, which takes the flush over. A rule that differs from the one of
// its name in the set keeps a state of its own.
func TestHybridStatesShared(t *testing.T) {
	f := newFixture(t)
	const limit = 20
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: time.Second,
		Hybrid: &Hybrid{SyncInterval: 100 * time.Millisecond, MaxLease: SingleLease(limit), Share: 1}}
	tier := Rule{Name: "tier", Algorithm: SlidingWindow, Limit: 1000, Window: time.Second,
		Hybrid: &Hybrid{SyncInterval: 100 * time.Millisecond, MaxLease: SingleLease(1000), Share: 1}}
	states := NewHybridStates()
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := f.limiter(t, Config{Rules: []Rule{rule}, HybridStates: states, SyncEvery: -1, Registerer: regA})
	b := f.limiter(t, Config{Rules: []Rule{tier, rule}, HybridStates: states, SyncEvery: -1, Registerer: regB})
	other := rule
	other.Limit = 30
	c := f.limiter(t, Config{Rules: []Rule{other}, HybridStates: states, SyncEvery: -1, Registerer: prometheus.NewRegistry()})
	if a.hybrid[0].hybridState != b.hybrid[1].hybridState || c.hybrid[0].hybridState == a.hybrid[0].hybridState {
		t.Fatal("want a's and b's hot to share one state, and c's (another limit) its own")
	}
	f.advance(300 * time.Millisecond) // past the limiters' settling: foreign counts would be counted

	admitted := 0
	for i := range 2 * limit {
		l, idx := a, 0
		if i%2 == 1 {
			l, idx = b, 1
		}
		res := allow(t, l, "k")
		if rd := res.Rules[idx]; rd.Rule != "hot" {
			t.Fatalf("request %d: rule %d is %q, want hot", i, idx, rd.Rule)
		}
		if res.Decision.Allowed {
			admitted++
		}
		f.advance(10 * time.Millisecond)
	}
	a.Sync(context.Background())
	if n := redisCount(t, f, "k", "hot"); admitted != limit || n != limit {
		t.Fatalf("admitted %d through two limiters of one limit, Redis counts %d: want the limit %d", admitted, n, limit)
	}
	if fa, fb := foreignCounts(t, regA, "hot"), foreignCounts(t, regB, "hot"); fa != 0 || fb != 0 {
		t.Fatalf("foreign counts %v and %v on one host, want none", fa, fb)
	}

	// a, the first user, flushes the shared state and reports its leases.
	if !a.hybrid[0].flusher(a) || b.hybrid[1].flusher(b) || !b.hybrid[0].flusher(b) {
		t.Fatal("want a to flush hot, b only its own tier rule")
	}
	if got := a.HybridLeases(); len(got) != 1 || got[0].Rule != "hot" || got[0].Leases != 1 {
		t.Fatalf("a reports %+v, want hot's one lease", got)
	}
	if got := b.HybridLeases(); len(got) != 1 || got[0].Rule != "tier" {
		t.Fatalf("b reports %+v, want only tier (hot is a's to report)", got)
	}
	// Closing a keeps hot's lease for b, which flushes it from now on.
	a.Close()
	if !b.hybrid[1].flusher(b) || leaseCount(a) != 1 {
		t.Fatalf("after a's Close: b flushes hot %v, hot's leases %d, want true and 1", b.hybrid[1].flusher(b), leaseCount(a))
	}
	f.advance(2 * time.Second) // the window slides: hot has its limit again
	n := 0
	for range 5 {
		if allow(t, b, "k").Decision.Allowed {
			n++
		}
	}
	b.backgroundSync(context.Background())
	if got := redisCount(t, f, "k", "hot"); n != 5 || got != 5 || foreignCounts(t, regB, "hot") != 0 {
		t.Fatalf("after a's Close, b admitted %d of 5 and flushed %d to Redis (foreign %v), want 5, 5 and 0", n, got, foreignCounts(t, regB, "hot"))
	}
}
