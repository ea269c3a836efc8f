package shed

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/testenv"

	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// manualTimers schedules queue timeouts on an l7test.ManualClock: nothing fires
// until the test calls Advance, which runs due callbacks in deadline order on
// the test's goroutine.
type manualTimers struct {
	clock *l7test.ManualClock

	mu      sync.Mutex
	pending []*manualTimer
}

type manualTimer struct {
	at      int64
	f       func()
	stopped bool
}

func (m *manualTimers) AfterFunc(d time.Duration, f func()) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{at: m.clock.Now() + int64(d), f: f}
	m.pending = append(m.pending, t)
	return func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		i := slices.Index(m.pending, t)
		if i < 0 {
			return false
		}
		m.pending = slices.Delete(m.pending, i, i+1)
		return true
	}
}

// Advance moves the clock and fires every timer that is now due.
func (m *manualTimers) Advance(d time.Duration) {
	m.clock.Advance(d)
	now := m.clock.Now()
	m.mu.Lock()
	var due []*manualTimer
	m.pending = slices.DeleteFunc(m.pending, func(t *manualTimer) bool {
		if t.at <= now {
			due = append(due, t)
			return true
		}
		return false
	})
	m.mu.Unlock()
	slices.SortStableFunc(due, func(a, b *manualTimer) int { return int(a.at - b.at) })
	for _, t := range due {
		t.f()
	}
}

// zeroThenRand returns 0 (a sure lottery win) for its first n draws, then
// draws from src.
type zeroThenRand struct {
	n   int
	src rand.Source
}

func (z *zeroThenRand) Uint64() uint64 {
	if z.n > 0 {
		z.n--
		return 0
	}
	return z.src.Uint64()
}

// alwaysLose makes every lottery draw the largest value: the request is shed
// whenever the queue is deeper than MaxQueue.
type alwaysLose struct{}

func (alwaysLose) Uint64() uint64 { return ^uint64(0) }

type manualEnv struct {
	clock  *l7test.ManualClock
	timers *manualTimers
}

func newManualEnv() manualEnv {
	c := &l7test.ManualClock{}
	return manualEnv{clock: c, timers: &manualTimers{clock: c}}
}

// limiter builds a Limiter on the manual clock and timers.
func (e manualEnv) limiter(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	cfg.Clock = e.clock
	cfg.AfterFunc = e.timers.AfterFunc
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

type acquireResult struct {
	permit Permit
	err    error
}

// acquireQueued starts an Acquire that must queue and waits until the queue
// has grown to depth (or the Acquire has returned).
func acquireQueued(t *testing.T, ctx context.Context, l *Limiter, p Priority, depth int64) <-chan acquireResult {
	t.Helper()
	ch := make(chan acquireResult, 1)
	go func() {
		pm, err := l.Acquire(ctx, p)
		ch <- acquireResult{pm, err}
	}()
	testenv.WaitFor(t, "the acquire to queue", func() bool { return l.QueueDepth() == depth || len(ch) > 0 })
	return ch
}

// result waits for an Acquire started by acquireQueued.
func result(t *testing.T, ch <-chan acquireResult) acquireResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("acquire did not return after 30s")
	}
	return acquireResult{}
}

func mustAcquire(t *testing.T, l *Limiter, p Priority) Permit {
	t.Helper()
	pm, err := l.Acquire(context.Background(), p)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", p, err)
	}
	return pm
}

func wantShed(t *testing.T, err error, want Reason) {
	t.Helper()
	got, ok := ReasonOf(err)
	if !ok {
		t.Fatalf("err = %v, want shed with reason %s", err, want)
	}
	if got != want {
		t.Fatalf("shed reason = %s, want %s (err %v)", got, want, err)
	}
}
