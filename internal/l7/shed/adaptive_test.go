package shed

import (
	"context"
	"slices"
	"testing"
	"time"
)

// runWindow scripts one adaptive window on the manual clock: rounds of
// requests that fill the current limit (critical, so the reserve does not
// cap them), each taking latency, until at least samples have completed;
// then it closes the window and returns the new limit.
func runWindow(t *testing.T, env manualEnv, l *Limiter, samples int, latency time.Duration) int64 {
	t.Helper()
	for done := 0; done < samples; {
		n := int(l.Limit())
		permits := make([]Permit, 0, n)
		for range n {
			permits = append(permits, mustAcquire(t, l, PriorityCritical))
		}
		env.clock.Advance(latency)
		for _, p := range permits {
			p.Release()
		}
		done += n
	}
	return l.UpdateLimit()
}

func TestAdaptiveGrowsByOnePerBusyWindowWhileLatencyIsFlat(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 10, MaxLimit: 25}})
	var got []int64
	for range 20 {
		got = append(got, runWindow(t, env, l, 10, 10*time.Millisecond))
	}
	want := []int64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 25, 25, 25, 25, 25}
	if !slices.Equal(got, want) {
		t.Fatalf("limits = %v\nwant     %v", got, want)
	}
	if b := l.Baseline(); b != 10*time.Millisecond {
		t.Fatalf("baseline = %s, want 10ms", b)
	}
}

func TestAdaptiveDoesNotGrowWhenIdleOrShortOfSamples(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 10, MinSamples: 10}})

	// 9 samples: not judged, carried over.
	for range 9 {
		p := mustAcquire(t, l, PriorityDefault)
		env.clock.Advance(time.Millisecond)
		p.Release()
	}
	if got := l.UpdateLimit(); got != 10 {
		t.Fatalf("limit after 9 samples = %d, want 10", got)
	}
	// The 10th sample completes the window; at most 1 of 10 slots was used,
	// so the limit holds.
	p := mustAcquire(t, l, PriorityDefault)
	env.clock.Advance(time.Millisecond)
	p.Release()
	if got := l.UpdateLimit(); got != 10 {
		t.Fatalf("limit after an idle window = %d, want 10", got)
	}
	if b := l.Baseline(); b != time.Millisecond {
		t.Fatalf("baseline = %s, want 1ms (the carried samples count)", b)
	}
}

// TestAdaptiveRecoversAfterLatencyStep scripts latency 10ms, then a step to
// 50ms that does not depend on concurrency, then back to 10ms. The limit
// must fall on the step; after 5 cuts that do not bring latency down, the
// baseline adopts 50ms and the limit grows again instead of pinning at its
// minimum; once latency drops it climbs back past its pre-step level.
func TestAdaptiveRecoversAfterLatencyStep(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 20, MinLimit: 2, MaxLimit: 200}})
	const fast, slow = 10 * time.Millisecond, 50 * time.Millisecond

	var before int64
	for range 30 {
		before = runWindow(t, env, l, 10, fast)
	}
	if before != 50 {
		t.Fatalf("limit after 30 fast windows = %d, want 50", before)
	}

	var step []int64
	for range 20 {
		step = append(step, runWindow(t, env, l, 10, slow))
	}
	t.Logf("during the step: %v (baseline now %s)", step, l.Baseline())
	// Exact: five cuts by 10% (rounded down), rebaseline, then +1.
	if want := []int64{45, 40, 36, 32, 28, 29, 30}; !slices.Equal(step[:7], want) {
		t.Fatalf("limits after the step = %v, want %v first", step, want)
	}
	if b := l.Baseline(); b != slow {
		t.Fatalf("baseline under the step = %s, want %s", b, slow)
	}
	lowest := slices.Min(step)
	if lowest <= 2 {
		t.Fatalf("limit pinned at its minimum during the step: %v", step)
	}
	if last := step[len(step)-1]; last <= lowest {
		t.Fatalf("limit did not grow again under the new normal latency: %v", step)
	}

	var after []int64
	for range 40 {
		after = append(after, runWindow(t, env, l, 10, fast))
	}
	t.Logf("after the step: %v", after)
	if got := after[len(after)-1]; got < before {
		t.Fatalf("limit after recovery = %d, want at least the pre-step %d", got, before)
	}
	if b := l.Baseline(); b != fast {
		t.Fatalf("baseline after recovery = %s, want %s", b, fast)
	}
}

// A latency step large enough to drive the limit to its minimum: the limit
// still climbs back once the baseline has adopted the new latency.
func TestAdaptiveLeavesMinimumUnderLastingHighLatency(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 2, MinLimit: 1, MaxLimit: 100}})
	runWindow(t, env, l, 10, time.Millisecond) // baseline 1ms, limit 3
	var got []int64
	for range 80 {
		got = append(got, runWindow(t, env, l, 10, 100*time.Millisecond))
	}
	t.Logf("limits under 100x latency: %v", got)
	if !slices.Contains(got, 1) {
		t.Fatalf("limit never reached the minimum; the scenario is too mild: %v", got)
	}
	if got[len(got)-1] < 10 {
		t.Fatalf("limit stuck near the minimum after 80 windows of steady latency: %v", got)
	}
}

func TestStaticLimitIgnoresUpdates(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 7})
	if got := l.UpdateLimit(); got != 7 {
		t.Fatalf("UpdateLimit on a static limiter = %d, want 7", got)
	}
	l.Run(context.Background()) // returns at once
}

func TestAdaptiveRunUpdatesOffTheRequestPath(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 10, Interval: time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	// Keep every window busy with flat latency until Run has raised the
	// limit at least once. Bounded: at most 100000 rounds.
	for i := 0; l.Limit() == 10; i++ {
		if i == 100000 {
			t.Fatal("Run never updated the limit")
		}
		n := int(l.Limit())
		ps := make([]Permit, 0, n)
		for range n {
			p, err := l.Acquire(ctx, PriorityCritical)
			if err != nil {
				break
			}
			ps = append(ps, p)
		}
		env.clock.Advance(time.Millisecond)
		for _, p := range ps {
			p.Release()
		}
		time.Sleep(100 * time.Microsecond)
	}
	cancel()
	<-done
}

// backendLatency models a backend with capacity c: latency is base while at
// most c requests run at once, and grows in proportion beyond (queueing).
func backendLatency(base time.Duration, c, n int64) time.Duration {
	if n <= c {
		return base
	}
	return base * time.Duration(n) / time.Duration(c)
}

// runModelWindow is runWindow against backendLatency: each round's latency
// depends on how many requests run together, which is the limit, or offered
// when the clients send fewer than that.
func runModelWindow(t *testing.T, env manualEnv, l *Limiter, base time.Duration, c, offered int64) int64 {
	t.Helper()
	for done := int64(0); done < 10; {
		n := min(l.Limit(), offered)
		permits := make([]Permit, 0, n)
		for range n {
			permits = append(permits, mustAcquire(t, l, PriorityCritical))
		}
		env.clock.Advance(backendLatency(base, c, n))
		for _, p := range permits {
			p.Release()
		}
		done += n
	}
	return l.UpdateLimit()
}

// TestAdaptiveFindsBackendCapacity runs the limit against a backend model
// whose latency grows once more than 40 requests run together, with more
// clients than it can take. With the 150% tolerance the limit should settle
// in a sawtooth just below where latency reaches 1.5x (60), not drift up as
// the latency it causes becomes familiar, and come back there after a
// latency step up and down.
func TestAdaptiveFindsBackendCapacity(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 10, MaxLimit: 1000, TolerancePercent: 150}})
	const capacity, flood, lull = 40, 1 << 20, 10
	fast, slow := 10*time.Millisecond, 50*time.Millisecond
	phase := func(name string, windows int, base time.Duration, offered int64) []int64 {
		var got []int64
		for range windows {
			got = append(got, runModelWindow(t, env, l, base, capacity, offered))
		}
		t.Logf("%s: last windows %v, baseline %s", name, got[max(len(got)-20, 0):], l.Baseline())
		return got
	}
	wantBand := func(name string, got []int64, lo, hi int64) {
		t.Helper()
		if a, b := slices.Min(got), slices.Max(got); a < lo || b > hi {
			t.Fatalf("%s: limit ranged over [%d, %d], want within [%d, %d]", name, a, b, lo, hi)
		}
	}

	got := phase("cold start", 300, fast, flood)
	wantBand("cold start, settled", got[100:], capacity, capacity*3/2+1)

	got = phase("latency x5", 200, slow, flood)
	wantBand("latency x5, settled", got[100:], capacity, capacity*3/2+1)

	// Latency drops while the limit sits where the backend queues a little:
	// the lowest mean it now sees (about 1.45x the unloaded latency) becomes
	// the baseline, so it settles higher, bounded by tolerance squared
	// (2.25 x 40 = 90). See docs/l7-shedding.md.
	got = phase("latency back", 200, fast, flood)
	wantBand("latency back, settled", got[100:], capacity, capacity*9/4)
	if got[len(got)-1] < capacity*3/2-6 {
		t.Fatalf("limit did not recover after latency came back: %v", got[len(got)-20:])
	}

	// A lull (10 clients) shows the unloaded latency again; under full load
	// the limit settles where it did from a cold start.
	phase("lull", 5, fast, lull)
	if b := l.Baseline(); b != fast {
		t.Fatalf("baseline after the lull = %s, want %s", b, fast)
	}
	got = phase("flood after lull", 300, fast, flood)
	wantBand("flood after lull, settled", got[100:], capacity, capacity*3/2+1)
}

func TestAdaptiveSampleEveryTimesOneRequestInN(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 10, MinSamples: 10, SampleEvery: 4}})
	one := func(latency time.Duration) {
		p := mustAcquire(t, l, PriorityDefault)
		env.clock.Advance(latency)
		p.Release()
	}
	// Requests 4, 8, ..., 36 are timed: 9 samples, not enough to judge.
	for i := 1; i <= 39; i++ {
		latency := time.Millisecond
		if i%4 != 0 {
			latency = time.Second // untimed; must not reach the mean
		}
		one(latency)
	}
	l.UpdateLimit()
	if b := l.Baseline(); b != 0 {
		t.Fatalf("baseline after 9 samples = %s, want 0 (window not judged)", b)
	}
	one(time.Millisecond) // request 40: the 10th sample
	l.UpdateLimit()
	if b := l.Baseline(); b != time.Millisecond {
		t.Fatalf("baseline = %s, want 1ms (only every 4th request timed)", b)
	}
}
