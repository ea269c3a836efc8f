package l7

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func mustAlg[T any](a T, err error) T {
	if err != nil {
		panic(err)
	}
	return a
}

// step is one request of a scripted timeline.
type step struct {
	at      int64 // ns
	n       int64
	allowed bool
	remain  int64
	retry   time.Duration // checked when !allowed
}

func runScript(t *testing.T, alg Algorithm, steps []step) {
	t.Helper()
	var s State
	for i, st := range steps {
		ns, d := alg.Take(s, st.at, st.n)
		if d.Allowed != st.allowed || d.Remaining != st.remain || (!st.allowed && d.RetryAfter != st.retry) {
			t.Fatalf("%s step %d (t=%dms n=%d): got allowed=%v remaining=%d retry=%s, want %v %d %s",
				alg.Name(), i, st.at/ms, st.n, d.Allowed, d.Remaining, d.RetryAfter, st.allowed, st.remain, st.retry)
		}
		if !d.Allowed && ns != s {
			t.Fatalf("%s step %d: rejected request changed the state %v -> %v", alg.Name(), i, s, ns)
		}
		s = ns
	}
}

func TestGCRAScript(t *testing.T) {
	g := mustAlg(NewGCRA(10, time.Second, 0))
	runScript(t, g, []step{
		{0, 5, true, 5, 0},
		{0, 5, true, 0, 0},
		{0, 1, false, 0, 100 * time.Millisecond},
		{50 * ms, 1, false, 0, 50 * time.Millisecond},
		{100 * ms, 1, true, 0, 0},
		{100 * ms, 2, false, 0, 200 * time.Millisecond},
		{400 * ms, 2, true, 1, 0},
		{5000 * ms, 11, false, 10, Never},
		{5000 * ms, 10, true, 0, 0},
	})
}

func TestGCRABurst(t *testing.T) {
	// 1 per 100ms sustained, bursts of 3.
	g := mustAlg(NewGCRA(10, time.Second, 3))
	runScript(t, g, []step{
		{0, 1, true, 2, 0},
		{0, 1, true, 1, 0},
		{0, 1, true, 0, 0},
		{0, 1, false, 0, 100 * time.Millisecond},
		{100 * ms, 1, true, 0, 0},
		{1000 * ms, 3, true, 0, 0},
	})
}

func TestTokenBucketScript(t *testing.T) {
	b := mustAlg(NewTokenBucket(3, time.Second, 0)) // one token per 333.33ms
	runScript(t, b, []step{
		{0, 3, true, 0, 0},
		{0, 1, false, 0, 333333334}, // ceil(1e9/3)
		{333333333, 1, false, 0, 1},
		{333333334, 1, true, 0, 0},
		{2000 * ms, 2, true, 1, 0},
		{2000 * ms, 4, false, 1, Never},
	})
}

func TestFixedWindowBoundaryBurst(t *testing.T) {
	f := mustAlg(NewFixedWindow(10, time.Second))
	runScript(t, f, []step{
		{999 * ms, 10, true, 0, 0},
		{999 * ms, 1, false, 0, time.Millisecond},
		// The boundary burst: 10 more one millisecond later, 20 in 2ms.
		{1000 * ms, 10, true, 0, 0},
		{1500 * ms, 1, false, 0, 500 * time.Millisecond},
		{2000 * ms, 11, false, 10, Never},
	})
}

func TestSlidingWindowStopsBoundaryBurst(t *testing.T) {
	w := mustAlg(NewSlidingWindow(10, time.Second))
	runScript(t, w, []step{
		{999 * ms, 10, true, 0, 0},
		// prev=10 weighted by (1000-0)/1000: the quota is full; one unit
		// frees when prev*(1-e/w) <= 9, at e = 100ms.
		{1000 * ms, 1, false, 0, 100 * time.Millisecond},
		{1099 * ms, 1, false, 0, time.Millisecond},
		{1100 * ms, 1, true, 0, 0},
		// At e=500ms: 10*0.5 + 1 = 6 used, 4 remaining.
		{1500 * ms, 4, true, 0, 0},
		// curr=5 and prev=10 at e=600: 4+5 = 9 used: 1 remaining.
		{1600 * ms, 2, false, 1, 100 * time.Millisecond},
		// At e=700: 3+5 = 8 used, 2 remaining.
		// Next window: prev=5, curr=0 at e=0: needs 5*(1-e) + 10 <= 10:
		// only at the start of the window after.
		{1700 * ms, 10, false, 2, 1300 * time.Millisecond},
		{3000 * ms, 10, true, 0, 0},
	})
}

// schedule is one request through b as a shaper: the new state, how long
// it is held, the decision.
func schedule(b *LeakyBucket, s State, at int64) (State, time.Duration, Decision) {
	ns, d := b.Take(s, at, 1)
	return ns, b.Delay(d, 1), d
}

func TestLeakyBucketQueue(t *testing.T) {
	b, err := NewLeakyBucket(10, time.Second, 3, 0) // I = 100ms, up to 3 waiting
	if err != nil {
		t.Fatal(err)
	}
	var s State
	want := []struct {
		at   int64
		ok   bool
		wait time.Duration
	}{
		{0, true, 0},
		{0, true, 100 * time.Millisecond},
		{0, true, 200 * time.Millisecond},
		{0, true, 300 * time.Millisecond},
		{0, false, 0},
		{50 * ms, false, 0},                      // slots 100, 200, 300ms are waiting: full
		{100 * ms, true, 300 * time.Millisecond}, // slot 100ms released
		{100 * ms, false, 0},
		{1000 * ms, true, 0},
	}
	for i, w := range want {
		ns, wait, d := schedule(b, s, w.at)
		if d.Allowed != w.ok || (w.ok && wait != w.wait) {
			t.Fatalf("step %d: got ok=%v wait=%s, want %v %s", i, d.Allowed, wait, w.ok, w.wait)
		}
		checkInvariants(t, b, s, w.at, 1)
		s = ns
	}
	mw, err := NewLeakyBucket(10, time.Second, 100, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	s = State{}
	admitted := 0
	for range 10 {
		var d Decision
		s, _, d = schedule(mw, s, 0)
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 3 { // waits 0, 100, 200; 300 > max wait
		t.Fatalf("max wait 250ms admitted %d at once, want 3", admitted)
	}
	// Depth 0: a strict one-per-interval policer.
	strict := mustAlg(NewLeakyBucket(10, time.Second, 0, 0))
	s = State{}
	for i, w := range []struct {
		at int64
		ok bool
	}{{0, true}, {0, false}, {99 * ms, false}, {100 * ms, true}, {150 * ms, false}, {200 * ms, true}} {
		var d Decision
		checkInvariants(t, strict, s, w.at, 1)
		s, d = strict.Take(s, w.at, 1)
		if d.Allowed != w.ok {
			t.Fatalf("depth 0, step %d at %dms: allowed %v, want %v", i, w.at/ms, d.Allowed, w.ok)
		}
	}
	if _, err := NewLeakyBucket(10, time.Second, -1, 0); err == nil {
		t.Fatal("negative depth accepted")
	}
}

// TestLeakyBucketRandom checks the leaky bucket against the
// continuous-state form of the same meter (ITU-T I.371): a backlog X, in
// nanoseconds of work, drains at one per nanosecond; a request for n units
// at t is admitted iff its last unit would wait at most the bound,
// max(0, X-(t-LCT)) + (n-1)*I <= bound, and then adds n*I.
func TestLeakyBucketRandom(t *testing.T) {
	for _, c := range []struct {
		limit int64
		depth int64
		wait  time.Duration
	}{{10, 3, 0}, {7, 0, 0}, {100, 20, 50 * time.Millisecond}, {3, 1, 0}} {
		b := mustAlg(NewLeakyBucket(c.limit, time.Second, c.depth, c.wait))
		I, bound := b.Interval(), b.bound
		var x, lct int64
		randomTimeline(t, b, uint64(c.limit*100+c.depth), func(now, n int64) bool {
			backlog := max(0, x-(now-lct))
			if backlog+(n-1)*I > bound {
				return false
			}
			x, lct = backlog+n*I, now
			return true
		})
	}
}

// checkInvariants verifies, for one decision, the contract of Algorithm on
// the pure function itself: RetryAfter is exact (admitted then, not a
// nanosecond before), Remaining is exactly how many more single units pass
// at the same instant, Reset is exactly when the key becomes idle.
func checkInvariants(t *testing.T, alg Algorithm, s State, now, n int64) {
	t.Helper()
	ns, d := alg.Take(s, now, n)
	if !d.Allowed {
		if ns != s {
			t.Fatalf("%s: rejection consumed quota: %v -> %v", alg.Name(), s, ns)
		}
		if d.RetryAfter == Never {
			return
		}
		if _, d2 := alg.Take(s, now+int64(d.RetryAfter), n); !d2.Allowed {
			t.Fatalf("%s: state %v now %d n %d: not admitted after RetryAfter %d", alg.Name(), s, now, n, d.RetryAfter)
		}
		if d.RetryAfter > 0 {
			if _, d2 := alg.Take(s, now+int64(d.RetryAfter)-1, n); d2.Allowed {
				t.Fatalf("%s: state %v now %d n %d: admitted 1ns before RetryAfter %d", alg.Name(), s, now, n, d.RetryAfter)
			}
		}
		return
	}
	// Remaining: exactly d.Remaining more single units pass now.
	cur := ns
	for i := int64(0); i < d.Remaining; i++ {
		var d2 Decision
		cur, d2 = alg.Take(cur, now, 1)
		if !d2.Allowed {
			t.Fatalf("%s: Remaining %d but unit %d rejected", alg.Name(), d.Remaining, i+1)
		}
	}
	if _, d2 := alg.Take(cur, now, 1); d2.Allowed {
		t.Fatalf("%s: Remaining %d but one more passed", alg.Name(), d.Remaining)
	}
	// Reset: idle exactly then.
	if !alg.Idle(ns, now+int64(d.Reset)) {
		t.Fatalf("%s: not idle after Reset %s", alg.Name(), d.Reset)
	}
	if d.Reset > 0 && alg.Idle(ns, now+int64(d.Reset)-1) {
		t.Fatalf("%s: idle before Reset %s", alg.Name(), d.Reset)
	}
}

func randomTimeline(t *testing.T, alg Algorithm, seed uint64, ref func(now, n int64) bool) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	var s State
	now := int64(0)
	w := int64(alg.Window())
	for i := range 3000 {
		switch r.IntN(4) {
		case 0:
			now += r.Int64N(w / 10)
		case 1:
			now += r.Int64N(2 * w)
		}
		n := 1 + r.Int64N(max(1, alg.Limit()/3))
		checkInvariants(t, alg, s, now, n)
		ns, d := alg.Take(s, now, n)
		if ref != nil {
			if want := ref(now, n); want != d.Allowed {
				t.Fatalf("%s step %d (now=%d n=%d): allowed=%v, reference says %v", alg.Name(), i, now, n, d.Allowed, want)
			}
		}
		s = ns
	}
}

func TestGCRAAgainstDefinition(t *testing.T) {
	for _, tc := range []struct{ limit, burst int64 }{{10, 0}, {7, 3}, {100, 1}} {
		g := mustAlg(NewGCRA(tc.limit, time.Second, tc.burst))
		T := int64(time.Second) / tc.limit
		B := g.Burst()
		var tat int64
		randomTimeline(t, g, 1, func(now, n int64) bool {
			if max(tat, now)+n*T-now > B*T {
				return false
			}
			tat = max(tat, now) + n*T
			return true
		})
	}
}

// TestTokenBucketAgainstRationals replays a timeline against a token bucket
// kept in exact rationals: tokens = min(burst, tokens + elapsed*limit/window).
func TestTokenBucketAgainstRationals(t *testing.T) {
	for _, tc := range []struct{ limit, burst int64 }{{10, 0}, {3, 5}, {1000, 10}} {
		b := mustAlg(NewTokenBucket(tc.limit, time.Second, tc.burst))
		tokens := big.NewRat(b.Burst(), 1)
		capRat := big.NewRat(b.Burst(), 1)
		last := int64(0)
		randomTimeline(t, b, 2, func(now, n int64) bool {
			refill := new(big.Rat).SetFrac64(now-last, int64(time.Second))
			refill.Mul(refill, big.NewRat(tc.limit, 1))
			tokens.Add(tokens, refill)
			if tokens.Cmp(capRat) > 0 {
				tokens.Set(capRat)
			}
			last = now
			need := big.NewRat(n, 1)
			if tokens.Cmp(need) < 0 {
				return false
			}
			tokens.Sub(tokens, need)
			return true
		})
	}
}

func TestFixedWindowAgainstDefinition(t *testing.T) {
	f := mustAlg(NewFixedWindow(10, time.Second))
	counts := map[int64]int64{}
	randomTimeline(t, f, 3, func(now, n int64) bool {
		k := now / int64(time.Second)
		if counts[k]+n > 10 {
			return false
		}
		counts[k] += n
		return true
	})
}

// TestSlidingWindowAgainstRationals checks prev*(1-elapsed/window)+curr+n <=
// limit in exact rationals.
func TestSlidingWindowAgainstRationals(t *testing.T) {
	for _, limit := range []int64{1, 10, 37} {
		w := mustAlg(NewSlidingWindow(limit, time.Second))
		win := int64(time.Second)
		counts := map[int64]int64{}
		randomTimeline(t, w, 4, func(now, n int64) bool {
			k := now / win
			e := now - k*win
			est := new(big.Rat).SetFrac64(counts[k-1]*(win-e), win)
			est.Add(est, big.NewRat(counts[k]+n, 1))
			if est.Cmp(big.NewRat(limit, 1)) > 0 {
				return false
			}
			counts[k] += n
			return true
		})
	}
}

func TestConstructorsRejectBadParameters(t *testing.T) {
	bad := []error{}
	_, err := NewGCRA(0, time.Second, 0)
	bad = append(bad, err)
	_, err = NewGCRA(10, 0, 0)
	bad = append(bad, err)
	_, err = NewGCRA(1<<40, time.Hour, 0)
	bad = append(bad, err)
	_, err = NewTokenBucket(10, time.Second, -1)
	bad = append(bad, err)
	_, err = NewSlidingWindow(1<<33, time.Millisecond)
	bad = append(bad, err)
	_, err = NewFixedWindow(-1, time.Second)
	bad = append(bad, err)
	_, err = NewLeakyBucket(10, time.Second, -1, 0)
	bad = append(bad, err)
	for i, err := range bad {
		if err == nil {
			t.Errorf("case %d: bad parameters accepted", i)
		}
	}
}
