package redislimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAllowNBatched: requests of cost 1 and of cost 3 for one key, asked
// concurrently so that batches mix both (the costly ones are sent beside
// the merged script run), take exactly the limit's units; a refund gives
// back the cost it took.
func TestAllowNBatched(t *testing.T) {
	f := newFixture(t)
	for _, alg := range []Algorithm{GCRA, SlidingWindow} {
		// The count is the point, not the latency: a round trip may take
		// longer than the 100 ms default on a loaded machine (it then
		// fails, and the test with it).
		l := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Timeout: 10 * time.Second,
			Rules: []Rule{{Name: "r" + alg.String(), Algorithm: alg, Limit: 300, Window: time.Hour, Burst: 300}}})
		var units atomic.Int64
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := int64(1 + 2*(w%2)) // 1 or 3
				for range 40 {
					res, err := l.AllowN(context.Background(), "k", n)
					if err != nil {
						t.Error(err)
						return
					}
					if res.Decision.Allowed {
						units.Add(n)
					}
				}
			}()
		}
		wg.Wait()
		// 16 workers ask 1,280 units of 300: at most 2 units are left
		// unused (a cost-3 request refused with 1 or 2 remaining).
		if got := units.Load(); got > 300 || got < 298 {
			t.Errorf("%s: %d units admitted of 300", alg, got)
		}
		rem := allow(t, l, "fresh-"+alg.String())
		res, err := l.AllowN(context.Background(), "fresh-"+alg.String(), 5)
		if err != nil || !res.Decision.Allowed || res.Decision.Remaining != rem.Decision.Remaining-5 {
			t.Fatalf("%s: cost 5 after %d remaining: %+v %v", alg, rem.Decision.Remaining, res.Decision, err)
		}
		if err := l.Refund(res); err != nil {
			t.Fatal(err)
		}
		if res.Rules[0].Decision.Remaining != rem.Decision.Remaining {
			t.Errorf("%s: refunded decision has %d remaining, want %d", alg, res.Rules[0].Decision.Remaining, rem.Decision.Remaining)
		}
		if after := allow(t, l, "fresh-"+alg.String()); after.Decision.Remaining != rem.Decision.Remaining-1 {
			t.Errorf("%s: after the refund of 5, a request leaves %d, want %d", alg, after.Decision.Remaining, rem.Decision.Remaining-1)
		}
	}
	if _, err := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Rules: []Rule{{Name: "x", Algorithm: GCRA, Limit: 1, Window: time.Second}}}).AllowN(context.Background(), "k", 0); err == nil {
		t.Error("cost 0 was accepted")
	}
}

// TestAllowNHybridAndDegrade: a cost above 1 on a hybrid rule takes that
// many units of the lease (a cost above MaxLease gets a grant sized for it
// while the window has room, and is refused with its own RetryAfter when
// it has not); on a Degrade rule with Redis down the local limit charges
// the cost. Refunds give the cost back in both.
func TestAllowNHybridAndDegrade(t *testing.T) {
	f := newFixture(t)
	r := hybridRuleFor(100) // MaxLease 50, Share 2
	l := f.limiter(t, Config{SyncEvery: -1, Rules: []Rule{r}})
	var units int64
	for i := range 40 {
		n := int64(1 + 2*(i%3)) // 1, 3, 5
		res, err := l.AllowN(context.Background(), "k", n)
		if err != nil {
			t.Fatal(err)
		}
		if res.Decision.Allowed {
			units += n
		}
	}
	if units < 96 || units > 100 {
		t.Fatalf("one instance admitted %d units of 100", units)
	}
	// A cost above MaxLease passes on a fresh key: the grant is raised to it.
	res, err := l.AllowN(context.Background(), "big", 70)
	if err != nil || !res.Decision.Allowed || res.Decision.Remaining != 30 {
		t.Fatalf("cost 70 of 100 on a fresh key: %+v %v", res.Decision, err)
	}
	if err := l.Refund(res); err != nil {
		t.Fatal(err)
	}
	res, err = l.AllowN(context.Background(), "big", 70)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("cost 70 after its refund: %+v %v", res.Decision, err)
	}
	res, err = l.AllowN(context.Background(), "big", 40)
	if err != nil || res.Decision.Allowed || res.Decision.RetryAfter <= 0 {
		t.Fatalf("cost 40 with 30 left: %+v %v, want refused with a RetryAfter", res.Decision, err)
	}
	if res, err = l.AllowN(context.Background(), "big", 30); err != nil || !res.Decision.Allowed {
		t.Fatalf("cost 30 with 30 left: %+v %v", res.Decision, err)
	}
	l.Sync(context.Background())
	if got := redisCount(t, f, "big", "hot"); got != 100 {
		t.Fatalf("Redis counted %d of key big, want 100 (70 + 30; the refunded 70 not at all)", got)
	}

	// Degrade with Redis down: Limit÷DegradeShards = 10 units locally.
	d := Rule{Name: "deg", Algorithm: GCRA, Limit: 20, Window: time.Hour, Failure: Degrade, DegradeShards: 2}
	ld := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Rules: []Rule{d}})
	f.srv.Stop()
	var local int64
	refunded := false
	for range 6 {
		res, err := ld.AllowN(context.Background(), "k", 3)
		if err != nil {
			t.Fatal(err)
		}
		if res.Rules[0].Source != SourceLocal {
			t.Fatalf("redis down: decided by %s, want local", res.Rules[0].Source)
		}
		if res.Decision.Allowed {
			local += 3
			if local == 9 && !refunded {
				refunded = true
				if err := ld.Refund(res); err != nil {
					t.Fatal(err)
				}
				local -= 3
			}
		}
	}
	if local != 9 {
		t.Fatalf("degrade admitted %d units, want 9 (three of cost 3 within 10, one refunded and taken again)", local)
	}
}
