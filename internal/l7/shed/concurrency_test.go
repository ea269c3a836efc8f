package shed

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestConcurrentAcquireReleaseKeepsInvariants hammers one limiter from real
// goroutines with mixed priorities, queue timeouts on real timers and
// contexts canceled mid-wait. Whatever the interleaving: never more than the
// limit in flight, never more than limit-reserve non-critical, every request
// counted exactly once, and everything drained at the end. Run with -race.
func TestConcurrentAcquireReleaseKeepsInvariants(t *testing.T) {
	for _, tc := range []struct {
		name     string
		timeout  time.Duration
		adaptive bool
	}{
		{"long timeout", time.Minute, false},
		{"tiny timeout", time.Microsecond, false},
		{"adaptive limit moving", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{MaxInFlight: 4, MaxQueue: 8, QueueHardLimit: 16, QueueTimeout: tc.timeout,
				CriticalReservePercent: 25}
			if tc.adaptive {
				cfg.Adaptive = &AdaptiveConfig{InitialLimit: 4, MinLimit: 2, MaxLimit: 8, MinSamples: 1}
			}
			l, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			const workers, rounds = 16, 300
			var all, nonCritical atomic.Int64
			var overAll, overNonCritical atomic.Int64
			stopUpdates := make(chan struct{})
			var updater sync.WaitGroup
			if tc.adaptive {
				updater.Go(func() {
					for {
						select {
						case <-stopUpdates:
							return
						default:
							l.UpdateLimit()
							runtime.Gosched()
						}
					}
				})
			}
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := range rounds {
						p := Priority((w + i) % numPriorities)
						ctx, cancel := context.WithCancel(context.Background())
						if i%7 == 0 {
							go cancel() // may land before, during or after the wait
						}
						pm, err := l.Acquire(ctx, p)
						cancel()
						if err != nil {
							if !errors.Is(err, ErrShed) {
								t.Errorf("Acquire: %v", err)
							}
							continue
						}
						limit := int64(8) // the adaptive maximum bounds every limit in force
						if !tc.adaptive {
							limit = 4
						}
						if all.Add(1) > limit {
							overAll.Add(1)
						}
						if p != PriorityCritical {
							if nonCritical.Add(1) > limit-reserveFor(limit, 25) {
								overNonCritical.Add(1)
							}
						}
						runtime.Gosched()
						if p != PriorityCritical {
							nonCritical.Add(-1)
						}
						all.Add(-1)
						pm.Release()
					}
				})
			}
			wg.Wait()
			close(stopUpdates)
			updater.Wait()
			if n := overAll.Load(); n != 0 {
				t.Errorf("in flight exceeded the limit %d times", n)
			}
			if n := overNonCritical.Load(); n != 0 {
				t.Errorf("non-critical requests entered the critical reserve %d times", n)
			}
			s := l.Stats()
			admitted, shed := s.Totals()
			t.Logf("admitted %d, shed %d, final limit %d", admitted, shed, s.Limit)
			if admitted+shed != workers*rounds {
				t.Errorf("admitted %d + shed %d = %d, want %d", admitted, shed, admitted+shed, workers*rounds)
			}
			if s.InFlight != 0 || s.QueueDepth != 0 || l.waiting.Load() != 0 {
				t.Errorf("not drained: in flight %d, queue %d, waiting %d", s.InFlight, s.QueueDepth, l.waiting.Load())
			}
		})
	}
}

// TestQueueTimeoutOnRealTimers runs the default time.AfterFunc timeout path
// inside a synctest bubble, where time is virtual: the wait is exactly the
// configured timeout, and a context deadline shorter than it wins.
func TestQueueTimeoutOnRealTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := New(Config{MaxInFlight: 1, MaxQueue: 4, QueueTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		held := mustAcquire(t, l, PriorityDefault)

		start := time.Now()
		_, err = l.Acquire(context.Background(), PriorityDefault)
		wantShed(t, err, ReasonQueueTimeout)
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("waited %s of virtual time, want 1s", waited)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start = time.Now()
		_, err = l.Acquire(ctx, PriorityDefault)
		wantShed(t, err, ReasonCanceled)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != 300*time.Millisecond {
			t.Fatalf("waited %s of virtual time, want 300ms", waited)
		}

		// A waiter granted a slot before its timeout stops its timer.
		done := make(chan error, 1)
		go func() {
			p, err := l.Acquire(context.Background(), PriorityDefault)
			if err == nil {
				p.Release()
			}
			done <- err
		}()
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		held.Release()
		if err := <-done; err != nil {
			t.Fatalf("waiter released at 500ms: %v", err)
		}
		if l.QueueDepth() != 0 || l.InFlight() != 0 {
			t.Fatalf("queue %d, in flight %d", l.QueueDepth(), l.InFlight())
		}
	})
}
