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
		l := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Rules: []Rule{{Name: "r" + alg.String(), Algorithm: alg, Limit: 300, Window: time.Hour, Burst: 300}}})
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
