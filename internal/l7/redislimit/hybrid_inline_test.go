package redislimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// commandCounter counts the commands a client sends, and fails them
// (without sending) while fail is set.
type commandCounter struct {
	n    atomic.Int64
	fail atomic.Bool
}

var errInjected = errors.New("redis down (injected)")

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		if c.fail.Load() {
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		if c.fail.Load() {
			for _, cmd := range cmds {
				cmd.SetErr(errInjected)
			}
			return errInjected
		}
		return next(ctx, cmds)
	}
}

// TestReady: Ready is true only when AllowN then decides without a round
// trip (no command reaches Redis), it charges nothing, and it is true for
// most requests of a hot key: a single host (Share 1) and hosts sharing a
// rule (Share 3), costs 1 to 3, a clock that moves past SyncInterval. A
// Limiter with a rule Redis decides is never Ready.
func TestReady(t *testing.T) {
	for _, share := range []int64{1, 3} {
		t.Run(fmt.Sprintf("share %d", share), func(t *testing.T) {
			f := newFixture(t)
			client := f.srv.Client(t)
			cc := &commandCounter{}
			client.AddHook(cc)
			rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: 300, Window: time.Minute,
				Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: 10, Share: share}}
			l := f.limiter(t, Config{Client: client, Registerer: prometheus.NewRegistry(), Rules: []Rule{rule}, SyncEvery: -1})
			rng := rand.New(rand.NewPCG(uint64(share), 1))
			var ready, notReady, admitted int
			for i := range 3000 {
				if rng.IntN(20) == 0 {
					f.advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
				}
				key, n := fmt.Sprint("k", rng.IntN(3)), int64(1+rng.IntN(3))
				r := l.Ready(key, n)
				if r2 := l.Ready(key, n); r2 != r {
					t.Fatalf("step %d: Ready changed from %v to %v when asked again: it charged", i, r, r2)
				}
				before := cc.n.Load()
				res, err := l.AllowN(context.Background(), key, n)
				if err != nil {
					t.Fatal(err)
				}
				if res.Decision.Allowed {
					admitted++
				}
				if r {
					ready++
					if sent := cc.n.Load() - before; sent != 0 {
						t.Fatalf("step %d: Ready(%s, %d) but AllowN sent %d commands", i, key, n, sent)
					}
				} else {
					notReady++
				}
			}
			t.Logf("share %d: %d requests Ready, %d not; %d admitted", share, ready, notReady, admitted)
			if ready < 2*notReady {
				t.Fatalf("%d Ready, %d not: most requests of a hot key should decide without a round trip", ready, notReady)
			}
		})
	}
	t.Run("a rule Redis decides", func(t *testing.T) {
		f := newFixture(t)
		l := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), SyncEvery: -1, Rules: []Rule{hybridRuleFor(100),
			{Name: "remote", Algorithm: SlidingWindow, Limit: 100, Window: time.Minute}}})
		for range 5 {
			allow(t, l, "k")
			if l.Ready("k", 1) || l.Inline() {
				t.Fatal("a Limiter with a rule Redis decides is Ready: its decisions always make a round trip")
			}
		}
	})
}

// singleHost is a single host's hybrid limiter of 2 requests per window
// on key "k", its client's command counter, and allow: one request, and
// how many commands it sent.
func singleHost(t *testing.T, f *fixture, window, syncInterval time.Duration) (*Limiter, *commandCounter, func() (bool, int64)) {
	t.Helper()
	client := f.srv.Client(t)
	cc := &commandCounter{}
	client.AddHook(cc)
	rule := Rule{Name: "ip", Algorithm: SlidingWindow, Limit: 2, Window: window,
		Hybrid: &Hybrid{SyncInterval: syncInterval, MaxLease: 1, Share: 1}}
	l := f.limiter(t, Config{Client: client, Registerer: prometheus.NewRegistry(), Rules: []Rule{rule}, SyncEvery: -1})
	return l, cc, func() (bool, int64) {
		t.Helper()
		before := cc.n.Load()
		res, err := l.AllowN(context.Background(), "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		return res.Decision.Allowed, cc.n.Load() - before
	}
}

// TestSingleHostRefusesWithoutSync: a single host whose lease is used up
// refuses what the window refuses without a round trip (and is Ready for
// it); the request the window would admit syncs first, as before.
func TestSingleHostRefusesWithoutSync(t *testing.T) {
	f := newFixture(t)
	l, _, allow := singleHost(t, f, time.Second, 10*time.Second)
	// Two admissions (the second after a sync: the lease holds 1), then
	// the window is full.
	if ok, _ := allow(); !ok {
		t.Fatal("first request refused")
	}
	if ok, sent := allow(); !ok || sent == 0 {
		t.Fatalf("second request: allowed %v after %d commands; want allowed after a sync (the lease of 1 was used)", ok, sent)
	}
	for i := range 20 {
		if !l.Ready("k", 1) {
			t.Fatalf("refusal %d: not Ready with the window full", i)
		}
		if ok, sent := allow(); ok || sent != 0 {
			t.Fatalf("refusal %d: allowed %v, %d commands sent; want refused without a round trip", i, ok, sent)
		}
	}
	// A window later the window admits again: the used-up lease syncs.
	f.advance(2 * time.Second)
	if l.Ready("k", 1) {
		t.Fatal("Ready for a request the window admits with the lease used up")
	}
	if ok, sent := allow(); !ok || sent == 0 {
		t.Fatalf("after the window: allowed %v after %d commands; want allowed after a sync", ok, sent)
	}
}

// TestSingleHostExpiredLeaseRefusesWithoutSync: a single host's lease
// that expired still refuses, without a round trip, what its view of the
// window refuses (a sync could only add another host's counts); a request
// the window admits syncs first; and a lease whose sync failed decides
// nothing from its view (the request asks Redis, then the rule's failure
// policy decides).
func TestSingleHostExpiredLeaseRefusesWithoutSync(t *testing.T) {
	f := newFixture(t)
	l, cc, allow := singleHost(t, f, 10*time.Second, 100*time.Millisecond)
	for i := range 2 {
		if ok, _ := allow(); !ok {
			t.Fatalf("request %d refused", i)
		}
	}
	// Ten lease lifetimes, the window still full: refused from the view.
	for i := range 10 {
		f.advance(150 * time.Millisecond)
		if !l.Ready("k", 1) {
			t.Fatalf("refusal %d: not Ready with the lease expired and the window full", i)
		}
		if ok, sent := allow(); ok || sent != 0 {
			t.Fatalf("refusal %d: allowed %v, %d commands sent; want refused without a round trip", i, ok, sent)
		}
	}
	// A flush that fails voids the lease: its view no longer refuses.
	cc.fail.Store(true)
	l.Sync(context.Background())
	if l.Ready("k", 1) {
		t.Fatal("Ready after the lease's sync failed")
	}
	ok, sent := allow()
	cc.fail.Store(false)
	if sent == 0 || !ok {
		t.Fatalf("after a failed sync: allowed %v after %d commands; want a round trip, then fail-open's admission", ok, sent)
	}
	// Two windows later the window admits again: the expired lease syncs.
	f.advance(20 * time.Second)
	if l.Ready("k", 1) {
		t.Fatal("Ready for a request the window admits with the lease expired")
	}
	if ok, sent := allow(); !ok || sent == 0 {
		t.Fatalf("after the window: allowed %v after %d commands; want allowed after a sync", ok, sent)
	}
}

// roundTripGate holds the first round trip (a command or a pipeline) sent
// after it is armed until the test releases it.
type roundTripGate struct {
	armed            atomic.Bool
	entered, release chan struct{}
}

func (g *roundTripGate) hold() {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
}

func (g *roundTripGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *roundTripGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.hold()
		return next(ctx, cmd)
	}
}
func (g *roundTripGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.hold()
		return next(ctx, cmds)
	}
}

// TestSyncHoldsOneBatch: the background flush takes a key's lease when
// its own batch is sent, so while one batch's round trip is in flight
// the keys of the batches after it still decide from their leases (their
// requests do not wait for every batch before theirs).
func TestSyncHoldsOneBatch(t *testing.T) {
	f := newFixture(t)
	client := f.srv.Client(t)
	gate := &roundTripGate{entered: make(chan struct{}), release: make(chan struct{})}
	client.AddHook(gate)
	rule := Rule{Name: "ip", Algorithm: SlidingWindow, Limit: 100, Window: time.Minute,
		Hybrid: &Hybrid{SyncInterval: time.Minute, MaxLease: 10, Share: 1}}
	l := f.limiter(t, Config{Client: client, Registerer: prometheus.NewRegistry(), Rules: []Rule{rule}, SyncEvery: -1, MaxBatch: 1})
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		for range 2 { // the first syncs, the second is unsynced
			if res, err := l.AllowN(context.Background(), k, 1); err != nil || !res.Decision.Allowed {
				t.Fatalf("%s: allowed %v, err %v", k, res.Decision.Allowed, err)
			}
		}
	}
	gate.armed.Store(true)
	done := make(chan struct{})
	go func() { defer close(done); l.Sync(context.Background()) }()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		gate.armed.Store(false)
		t.Fatal("the flush sent nothing in 10 s")
	}
	ready := 0
	for _, k := range keys {
		if l.Ready(k, 1) {
			ready++
		}
	}
	close(gate.release)
	<-done
	if ready != len(keys)-1 {
		t.Fatalf("%d of %d keys decide from their leases while the first batch (one key) is in flight; want %d", ready, len(keys), len(keys)-1)
	}
	for _, k := range keys {
		if !l.Ready(k, 1) {
			t.Fatalf("%s: not Ready after the flush", k)
		}
	}
}
