package loader_test

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func clockNS(t *testing.T, id int32) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		t.Fatalf("clock_gettime(%d): %v", id, err)
	}
	return uint64(ts.Nano())
}

// TestBucketClock runs one packet through a fresh global bucket on the
// kernel's clocks (no test clock) and reads back the time the program
// charged it at: with clock coarse it is exactly CLOCK_MONOTONIC_COARSE
// (read before and after, in the same tick), with clock precise it lies
// between two CLOCK_MONOTONIC reads.
func TestBucketClock(t *testing.T) {
	requireRoot(t)
	global := policy.Bucket{Packets: perSecond(1, 1)}
	cfg, err := maps.BucketConfig(global)
	if err != nil {
		t.Fatal(err)
	}
	charged := func(t *testing.T, clock policy.Clock, id int32) (before, at, after uint64) {
		d, err := loader.Load(loader.Options{Sizes: smallSizes})
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		defer d.Close()
		td := &testDatapath{tb: t, d: d, m: maps.New(d)}
		g := defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}})
		g.Global = global
		g.Clock = clock
		td.apply(g)
		before = clockNS(t, id)
		if got := td.run(benchFrame(src4(1))); got != xdpPass {
			t.Fatalf("first packet: action %d, want pass", got)
		}
		after = clockNS(t, id)
		var b loader.LimiterEgBucket
		if err := d.Objects.GlobalBuckets.Lookup(uint32(loader.LimiterEgGlobalSlotEG_GLOBAL_BUCKET), &b); err != nil {
			t.Fatal(err)
		}
		return before, (b.PktTat - cfg.PktT) >> maps.TickShift, after
	}

	t.Run("coarse", func(t *testing.T) {
		var res unix.Timespec
		if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &res); err != nil {
			t.Fatal(err)
		}
		// A tick may pass between the two reads; then try again.
		for try := 0; ; try++ {
			before, at, after := charged(t, policy.ClockCoarse, unix.CLOCK_MONOTONIC_COARSE)
			if before == after {
				if at != before {
					t.Fatalf("charged at %d ns, CLOCK_MONOTONIC_COARSE is %d (tick %v)", at, before, time.Duration(res.Nano()))
				}
				return
			}
			if at < before || at > after {
				t.Fatalf("charged at %d ns, outside CLOCK_MONOTONIC_COARSE [%d, %d]", at, before, after)
			}
			if try == 20 {
				t.Fatalf("the coarse clock ticked during every one of %d tries", try+1)
			}
		}
	})
	t.Run("precise", func(t *testing.T) {
		before, at, after := charged(t, policy.ClockPrecise, unix.CLOCK_MONOTONIC)
		if at < before || at > after {
			t.Fatalf("charged at %d ns, outside CLOCK_MONOTONIC [%d, %d]", at, before, after)
		}
	})
}

// TestCoarseClockLag checks what docs/operations.md ("Clock") relies on:
// the coarse clock is never ahead of the precise one, and behind it by at
// most a few ticks (less than one while a CPU is busy; more on a CPU
// coming out of idle, or while the timekeeping CPU stalls). Each sample
// reads precise, coarse, precise: a preemption between the reads can only
// shrink what is measured, never fail the test.
func TestCoarseClockLag(t *testing.T) {
	var res unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &res); err != nil {
		t.Fatal(err)
	}
	tick := uint64(res.Nano())
	if tick == 0 || tick > uint64(10*time.Millisecond) {
		t.Fatalf("CLOCK_MONOTONIC_COARSE resolution %v: want one tick, 1-10 ms", time.Duration(tick))
	}
	var worst uint64
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		p1 := clockNS(t, unix.CLOCK_MONOTONIC)
		c := clockNS(t, unix.CLOCK_MONOTONIC_COARSE)
		p2 := clockNS(t, unix.CLOCK_MONOTONIC)
		if c > p2 {
			t.Fatalf("coarse clock %d ahead of the precise one %d", c, p2)
		}
		if p1 > c {
			worst = max(worst, p1-c)
		}
		time.Sleep(37 * time.Microsecond)
	}
	// MAX_STALLED_JIFFIES is 5 ticks: past it another CPU takes the
	// update over. 10 leaves room for a slow virtual machine.
	if worst > 10*tick {
		t.Fatalf("coarse clock lagged %v, tick %v", time.Duration(worst), time.Duration(tick))
	}
	t.Logf("tick %v, worst lag %v", time.Duration(tick), time.Duration(worst))
}
