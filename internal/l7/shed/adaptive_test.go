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
// 50ms, then back to 10ms. The limit must fall on the step, must not pin at
// its minimum while latency stays high (the baseline adopts the new normal),
// and must climb back past its pre-step level once latency drops.
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
	// Exact first cuts: 50*0.9=45, 45*0.9=40, 40*0.9=36.
	if !slices.Equal(step[:3], []int64{45, 40, 36}) {
		t.Fatalf("first cuts = %v, want [45 40 36]", step[:3])
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
	l := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 4, MinLimit: 1, MaxLimit: 100}})
	for range 5 {
		runWindow(t, env, l, 10, time.Millisecond)
	}
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
