package l7

import (
	"context"
	"errors"
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

func TestSlidingLogExact(t *testing.T) {
	var c ManualClock
	l := mustAlg(NewSlidingLog(3, time.Second, &c))
	check := func(at, n int64, allowed bool, remain int64, retry time.Duration) {
		t.Helper()
		d := l.TakeAt(at, n)
		if d.Allowed != allowed || d.Remaining != remain || (!allowed && d.RetryAfter != retry) {
			t.Fatalf("t=%dms n=%d: got %+v", at/ms, n, d)
		}
	}
	check(0, 1, true, 2, 0)
	check(400*ms, 1, true, 1, 0)
	check(800*ms, 1, true, 0, 0)
	check(999*ms, 1, false, 0, time.Millisecond)
	check(1000*ms, 2, false, 1, 400*time.Millisecond) // the t=0 unit has left
	check(1000*ms, 1, true, 0, 0)
	check(1000*ms, 4, false, 0, Never)
	if _, err := NewSlidingLog(MaxSlidingLogEntries+1, time.Second, &c); err == nil {
		t.Fatal("limit above the memory cap accepted")
	}
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
		ns, wait, d := b.Schedule(s, w.at)
		if d.Allowed != w.ok || (w.ok && wait != w.wait) {
			t.Fatalf("step %d: got ok=%v wait=%s, want %v %s", i, d.Allowed, wait, w.ok, w.wait)
		}
		if !d.Allowed {
			if ns != s {
				t.Fatalf("step %d: rejected request took a slot", i)
			}
			// It fits exactly RetryAfter later.
			if _, _, d2 := b.Schedule(s, w.at+int64(d.RetryAfter)); !d2.Allowed {
				t.Fatalf("step %d: not admitted after RetryAfter %s", i, d.RetryAfter)
			}
			if _, _, d2 := b.Schedule(s, w.at+int64(d.RetryAfter)-1); d2.Allowed {
				t.Fatalf("step %d: admitted before RetryAfter %s", i, d.RetryAfter)
			}
		}
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
		s, _, d = mw.Schedule(s, 0)
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 3 { // waits 0, 100, 200; 300 > max wait
		t.Fatalf("max wait 250ms admitted %d at once, want 3", admitted)
	}
}

// TestLeakyQueueReleasesAtFixedRate uses the real clock: releases must be
// spaced by at least the interval (timers never fire early); the upper bound
// is loose for a noisy machine.
func TestLeakyQueueReleasesAtFixedRate(t *testing.T) {
	b, err := NewLeakyBucket(50, time.Second, 10, time.Second) // I = 20ms
	if err != nil {
		t.Fatal(err)
	}
	q := NewLeakyQueue(b, NewSystemClock())
	start := time.Now()
	done := make(chan time.Duration, 5)
	for range 5 {
		go func() {
			if err := q.Wait(t.Context()); err != nil {
				t.Error(err)
			}
			done <- time.Since(start)
		}()
	}
	var last time.Duration
	for range 5 {
		if at := <-done; at > last {
			last = at
		}
	}
	if last < 80*time.Millisecond || last > 5*time.Second {
		t.Fatalf("5 requests at 20ms interval released by %s, want >= 80ms", last)
	}
}

// TestLeakyQueueCancelAndFull: a caller whose context ends keeps its slot,
// and a full queue refuses at once without taking one.
func TestLeakyQueueCancelAndFull(t *testing.T) {
	b, err := NewLeakyBucket(1, 10*time.Second, 1, 0) // I = 10s, one waiter
	if err != nil {
		t.Fatal(err)
	}
	q := NewLeakyQueue(b, NewSystemClock())
	if err := q.Wait(t.Context()); err != nil {
		t.Fatalf("first caller: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := q.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second caller: %v, want deadline exceeded", err)
	}
	// The cancelled caller's slot (~10s away) is still taken: the next
	// would wait ~20s > depth*I.
	if err := q.Wait(t.Context()); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third caller: %v, want ErrQueueFull", err)
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

func TestSlidingLogAgainstDefinition(t *testing.T) {
	var c ManualClock
	l := mustAlg(NewSlidingLog(20, time.Second, &c))
	r := rand.New(rand.NewPCG(5, 1))
	var admitted []int64
	now := int64(0)
	for i := range 3000 {
		now += r.Int64N(int64(time.Second) / 8)
		n := 1 + r.Int64N(5)
		live := int64(0)
		for _, a := range admitted {
			if now-a < int64(time.Second) {
				live++
			}
		}
		want := live+n <= 20
		d := l.TakeAt(now, n)
		if d.Allowed != want {
			t.Fatalf("step %d: allowed=%v, want %v (live %d, n %d)", i, d.Allowed, want, live, n)
		}
		if want {
			for range n {
				admitted = append(admitted, now)
			}
		}
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
	_, err = NewLeakyBucket(10, time.Second, 0, 0)
	bad = append(bad, err)
	for i, err := range bad {
		if err == nil {
			t.Errorf("case %d: bad parameters accepted", i)
		}
	}
}
