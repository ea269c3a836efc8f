package redislimit

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// The scripts implement package l7's GCRA and SlidingWindow (which the local
// fallback runs): on the same random timeline they must answer exactly what
// Redis answers, field for field.
func TestLocalMatchesRedis(t *testing.T) {
	f := newFixture(t)
	for _, r := range []Rule{
		{Name: "gcra", Algorithm: GCRA, Limit: 7, Window: time.Second, Burst: 3, DegradeShards: 1},
		{Name: "swc", Algorithm: SlidingWindow, Limit: 7, Window: time.Second, DegradeShards: 1},
	} {
		t.Run(r.Name, func(t *testing.T) {
			l := f.limiter(t, Config{Rules: []Rule{r}, MaxBatch: 1, Registerer: prometheus.NewRegistry()})
			local, err := newLocalRule(r, 10)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for step := range 400 {
				// Whole microseconds: the scripts read Redis TIME's µs.
				f.advance(time.Duration(rng.Int64N(int64(r.Window)/r.Limit/1000*2)) * time.Microsecond)
				got := allow(t, l, "k").Decision
				local.mu.Lock()
				c := local.check("k", f.script.Now(), 1)
				if c.decision.Allowed {
					c.commit()
				}
				local.mu.Unlock()
				want := c.decision
				if r.Algorithm == SlidingWindow && got.RetryAfter >= want.RetryAfter && got.RetryAfter-want.RetryAfter < time.Microsecond {
					// The script's sliding window works in whole µs: its
					// RetryAfter is l7's exact instant rounded up to the µs.
					want.RetryAfter = got.RetryAfter
				}
				if got != want {
					t.Fatalf("step %d: redis %+v\nlocal %+v", step, got, c.decision)
				}
			}
		})
	}
}

func TestLocalDegradeShareAndOverflow(t *testing.T) {
	r := Rule{Name: "r", Algorithm: GCRA, Limit: 10, Window: time.Second, DegradeShards: 4}
	l, err := newLocalRule(r, 2)
	if err != nil {
		t.Fatal(err)
	}
	if g := l.alg.(*l7.GCRA); g.Limit() != 2 || g.Burst() != 2 {
		t.Fatalf("limit 10 ÷ 4 gave %d/%d, want 2 (rounded down)", g.Limit(), g.Burst())
	}
	take := func(key string) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		c := l.check(key, 0, 1)
		if c.decision.Allowed {
			c.commit()
		}
		return c.decision.Allowed
	}
	take("a")
	take("b")
	// Table full and nothing idle: new keys share one overflow state.
	if !take("c") || !take("d") || take("e") {
		t.Fatal("overflow keys should share one limit of 2")
	}
	if len(l.states) != 3 {
		t.Fatalf("%d states, want 2 + overflow", len(l.states))
	}
}
