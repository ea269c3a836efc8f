package redislimit

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The local fallback is a Go copy of the scripts' arithmetic: on the same
// random timeline it must answer exactly what Redis answers.
func TestLocalMatchesRedis(t *testing.T) {
	f := newFixture(t)
	for _, r := range []Rule{
		{Name: "gcra", Algorithm: GCRA, Limit: 7, Window: time.Second, Burst: 3, DegradeShards: 1},
		{Name: "swc", Algorithm: SlidingWindow, Limit: 7, Window: time.Second, DegradeShards: 1},
	} {
		t.Run(r.Name, func(t *testing.T) {
			l := f.limiter(t, Config{Rules: []Rule{r}, MaxBatch: 1, Registerer: prometheus.NewRegistry()})
			local := newLocalRule(r, 10)
			rng := rand.New(rand.NewPCG(1, 2))
			for step := range 400 {
				f.advance(time.Duration(rng.Int64N(int64(r.Window) / r.Limit * 2)))
				got := allow(t, l, "k").Decision
				local.mu.Lock()
				c := local.check("k", f.script.Now())
				if c.decision.Allowed {
					c.commit()
				}
				local.mu.Unlock()
				if got != c.decision {
					t.Fatalf("step %d: redis %+v\nlocal %+v", step, got, c.decision)
				}
			}
		})
	}
}

func TestLocalDegradeShareAndOverflow(t *testing.T) {
	r := Rule{Name: "r", Algorithm: GCRA, Limit: 10, Window: time.Second, DegradeShards: 4}
	l := newLocalRule(r, 2)
	if l.limit != 2 || l.burst != 2 {
		t.Fatalf("limit 10 ÷ 4 gave %d/%d, want 2 (rounded down)", l.limit, l.burst)
	}
	take := func(key string) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		c := l.check(key, 0)
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
