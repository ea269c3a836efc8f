package redislimit

import (
	"fmt"
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

// TestLocalSprayIntoFullMap: new keys sprayed at a full map of busy keys
// (a key spray during a Redis outage) share the overflow state, and cost a
// sweep of the map per 1/16 of it, not one per request; once the busy
// keys go idle, a sweep frees them and new keys get their own states.
func TestLocalSprayIntoFullMap(t *testing.T) {
	const maxKeys = 1024
	lr, err := newLocalRule(Rule{Name: "swc", Algorithm: SlidingWindow, Limit: 100, Window: time.Minute, DegradeShards: 1}, maxKeys)
	if err != nil {
		t.Fatal(err)
	}
	take := func(key string, now int64) l7.Decision {
		lr.mu.Lock()
		defer lr.mu.Unlock()
		c := lr.check(key, now, 1)
		if c.decision.Allowed {
			c.commit()
		}
		return c.decision
	}
	now := int64(time.Hour)
	for i := range maxKeys {
		take(fmt.Sprint("busy", i), now)
	}
	const spray = 100_000
	for i := range spray {
		take(fmt.Sprint("new", i), now)
	}
	if len(lr.states) != maxKeys+1 {
		t.Fatalf("%d states after the spray, want the %d busy ones and the overflow state", len(lr.states), maxKeys)
	}
	if d := take("new-again", now); d.Allowed {
		t.Fatal("a new key was admitted with the overflow state used up: the spray is limited as one client")
	}
	if limit := spray/(maxKeys/sweepShare) + 1; lr.sweeps > limit {
		t.Fatalf("%d sweeps of the full map for %d new keys, want at most %d", lr.sweeps, spray, limit)
	}
	// Two windows later every state is idle: the next sweep (after at
	// most maxKeys/16 more new keys) frees them.
	now += int64(2 * time.Minute)
	for i := range maxKeys / sweepShare {
		take(fmt.Sprint("later", i), now)
	}
	if d := take("fresh", now); !d.Allowed || len(lr.states) > maxKeys/2 {
		t.Fatalf("after the busy keys went idle: allowed %v with %d states; want a state of its own in a swept map", d.Allowed, len(lr.states))
	}
}
