package shed

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func TestFastPathAdmitsUpToLimitThenSheds(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 3, CriticalReservePercent: -1})

	a := mustAcquire(t, l, PriorityDefault)
	b := mustAcquire(t, l, PriorityDefault)
	c := mustAcquire(t, l, PriorityDefault)
	if got := l.InFlight(); got != 3 {
		t.Fatalf("in flight = %d, want 3", got)
	}
	_, err := l.Acquire(context.Background(), PriorityDefault)
	wantShed(t, err, ReasonAtLimit)
	if !errors.Is(err, ErrShed) {
		t.Fatalf("errors.Is(%v, ErrShed) = false", err)
	}
	b.Release()
	d := mustAcquire(t, l, PriorityDefault)
	for _, p := range []Permit{a, c, d} {
		p.Release()
	}
	s := l.Stats()
	if s.InFlight != 0 || s.QueueDepth != 0 {
		t.Fatalf("after releases: in flight %d, queue %d; want 0, 0", s.InFlight, s.QueueDepth)
	}
	if s.Admitted[PriorityDefault] != 4 || s.Shed[ReasonAtLimit][PriorityDefault] != 1 {
		t.Fatalf("admitted %v, shed at_limit %v; want 4 default admitted, 1 default shed",
			s.Admitted, s.Shed[ReasonAtLimit])
	}
	Permit{}.Release() // the zero Permit is inert
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no limit":           {},
		"negative queue":     {MaxInFlight: 1, MaxQueue: -1},
		"reserve 100%":       {MaxInFlight: 1, CriticalReservePercent: 100},
		"adaptive min > max": {Adaptive: &AdaptiveConfig{MinLimit: 5, MaxLimit: 2}},
		"adaptive tolerance": {Adaptive: &AdaptiveConfig{TolerancePercent: 100}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

func TestQueueHandsSlotsOverInFIFOOrder(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 5, QueueTimeout: time.Second})
	ctx := context.Background()

	held := mustAcquire(t, l, PriorityDefault)
	first := acquireQueued(t, ctx, l, PriorityDefault, 1)
	second := acquireQueued(t, ctx, l, PriorityDefault, 2)

	held.Release()
	r := result(t, first)
	if r.err != nil {
		t.Fatalf("first queued: %v", r.err)
	}
	if got := l.QueueDepth(); got != 1 {
		t.Fatalf("queue depth after one hand-off = %d, want 1", got)
	}
	if got := l.InFlight(); got != 1 {
		t.Fatalf("in flight after hand-off = %d, want 1 (slot passed on, not freed)", got)
	}
	r.permit.Release()
	r = result(t, second)
	if r.err != nil {
		t.Fatalf("second queued: %v", r.err)
	}
	r.permit.Release()
	if l.InFlight() != 0 || l.QueueDepth() != 0 {
		t.Fatalf("in flight %d, queue %d; want 0, 0", l.InFlight(), l.QueueDepth())
	}
}

func TestQueueTimeoutShedsOnTheScriptedClock(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 5, QueueTimeout: 100 * time.Millisecond})

	held := mustAcquire(t, l, PriorityDefault)
	defer held.Release()
	ch := acquireQueued(t, context.Background(), l, PriorityDefault, 1)

	env.timers.Advance(99 * time.Millisecond)
	if got := l.QueueDepth(); got != 1 {
		t.Fatalf("queue depth at 99ms = %d, want 1 (still waiting)", got)
	}
	env.timers.Advance(time.Millisecond)
	r := result(t, ch)
	wantShed(t, r.err, ReasonQueueTimeout)
	if got := l.QueueDepth(); got != 0 {
		t.Fatalf("queue depth after timeout = %d, want 0", got)
	}
	if got := l.Stats().Shed[ReasonQueueTimeout][PriorityDefault]; got != 1 {
		t.Fatalf("queue_timeout count = %d, want 1", got)
	}
}

func TestCanceledContextLeavesQueueAndFreesItsPlace(t *testing.T) {
	env := newManualEnv()
	// Hard limit 1: the canceled waiter's place is the only one.
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 1, QueueHardLimit: 1, QueueTimeout: time.Hour})

	held := mustAcquire(t, l, PriorityDefault)
	ctx, cancel := context.WithCancel(context.Background())
	leaving := acquireQueued(t, ctx, l, PriorityDefault, 1)

	_, err := l.Acquire(context.Background(), PriorityDefault)
	wantShed(t, err, ReasonQueueFull)

	cancel()
	r := result(t, leaving)
	if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, ErrShed) {
		t.Fatalf("err = %v, want one matching context.Canceled and ErrShed", r.err)
	}
	wantShed(t, r.err, ReasonCanceled)
	if got := l.QueueDepth(); got != 0 {
		t.Fatalf("queue depth after cancel = %d, want 0", got)
	}

	// The freed place takes a new waiter, which gets the next slot.
	next := acquireQueued(t, context.Background(), l, PriorityDefault, 1)
	held.Release()
	r = result(t, next)
	if r.err != nil {
		t.Fatalf("waiter after cancel: %v", r.err)
	}
	r.permit.Release()
	if got := l.Stats().Shed[ReasonCanceled][PriorityDefault]; got != 1 {
		t.Fatalf("canceled count = %d, want 1", got)
	}
}

// A request whose context is already done still runs the queue admission
// (lottery included) and then leaves at once: this is what the statistical
// test below relies on to measure the lottery without goroutines.
func TestDoneContextLeavesQueueSynchronously(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 2})
	held := mustAcquire(t, l, PriorityDefault)
	defer held.Release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Acquire(ctx, PriorityDefault)
	wantShed(t, err, ReasonCanceled)
	if got := l.QueueDepth(); got != 0 {
		t.Fatalf("queue depth = %d, want 0", got)
	}
}

// TestShedProbabilityMatchesMaxQueueOverDepth measures the lottery: at queue
// depth d > MaxQueue an arrival survives with probability MaxQueue/d. Each
// depth gets n draws from a seeded PCG; the tolerance is 5 standard
// deviations of the binomial count, so a correct implementation fails with
// probability below 1e-6 per depth (and the seed makes it reproducible).
func TestShedProbabilityMatchesMaxQueueOverDepth(t *testing.T) {
	const maxQueue, n = 10, 20000
	for _, depth := range []int{11, 20, 40, 100} {
		env := newManualEnv()
		// The first depth-1 draws fill the queue with critical waiters
		// (sure wins); every later draw comes from the seeded PCG.
		l := env.limiter(t, Config{
			MaxInFlight: 1, MaxQueue: maxQueue, QueueHardLimit: 1000, QueueTimeout: time.Hour,
			Rand: &zeroThenRand{n: depth - 1, src: rand.NewPCG(1, uint64(depth))},
		})
		held := mustAcquire(t, l, PriorityCritical)
		for i := 1; i < depth; i++ {
			acquireQueued(t, context.Background(), l, PriorityCritical, int64(i))
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		survived := 0
		for range n {
			_, err := l.Acquire(done, PriorityDefault)
			switch r, _ := ReasonOf(err); r {
			case ReasonCanceled:
				survived++ // won a place, then left because its context was done
			case ReasonQueueShed:
			default:
				t.Fatalf("depth %d: unexpected outcome %v", depth, err)
			}
		}
		p := float64(maxQueue) / float64(depth)
		mean, sd := n*p, math.Sqrt(n*p*(1-p))
		t.Logf("depth %d: survived %d of %d, expected %.0f ± %.0f (5σ)", depth, survived, n, mean, 5*sd)
		if math.Abs(float64(survived)-mean) > 5*sd {
			t.Errorf("depth %d: survived %d of %d, want %.0f ± %.0f", depth, survived, n, mean, 5*sd)
		}
		if got := l.QueueDepth(); got != int64(depth-1) {
			t.Errorf("depth %d: queue depth drifted to %d", depth, got)
		}
		held.Release()
	}
}

// Lottery depth counts only the requests served before the arrival.
func TestLotteryDepthIgnoresLowerPrioritiesBehind(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 2, QueueHardLimit: 100, QueueTimeout: time.Hour,
		Rand: &zeroThenRand{n: 3, src: alwaysLose{}}}) // depths 3..5 draw
	held := mustAcquire(t, l, PriorityDefault)
	defer held.Release()
	for i := int64(1); i <= 5; i++ {
		acquireQueued(t, context.Background(), l, PrioritySheddable, i)
	}
	// Every draw now loses. A default arrival sees depth 1 (nothing ahead
	// of it), below MaxQueue, so it draws nothing and queues.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Acquire(done, PriorityDefault)
	wantShed(t, err, ReasonCanceled)
	// A sheddable arrival sees all 5 ahead: depth 6 > 2, draws, loses.
	_, err = l.Acquire(done, PrioritySheddable)
	wantShed(t, err, ReasonQueueShed)
}

func TestFullQueueEvictsLowestPriorityNewestFirst(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 3, QueueHardLimit: 3, QueueTimeout: time.Hour})
	ctx := context.Background()
	held := mustAcquire(t, l, PriorityDefault)

	shedOld := acquireQueued(t, ctx, l, PrioritySheddable, 1)
	shedNew := acquireQueued(t, ctx, l, PrioritySheddable, 2)
	def := acquireQueued(t, ctx, l, PriorityDefault, 3)

	// Full, and nothing below sheddable: a sheddable arrival is refused.
	_, err := l.Acquire(ctx, PrioritySheddable)
	wantShed(t, err, ReasonQueueFull)

	// A critical arrival pushes out the newest sheddable.
	crit := acquireQueued(t, ctx, l, PriorityCritical, 3)
	wantShed(t, result(t, shedNew).err, ReasonEvicted)
	// A default arrival pushes out the remaining sheddable.
	def2 := acquireQueued(t, ctx, l, PriorityDefault, 3)
	wantShed(t, result(t, shedOld).err, ReasonEvicted)
	// Now only critical and default remain; a default arrival finds
	// nothing below it.
	_, err = l.Acquire(ctx, PriorityDefault)
	wantShed(t, err, ReasonQueueFull)

	// Slots go critical first, then defaults in arrival order.
	order := []<-chan acquireResult{crit, def, def2}
	held.Release()
	for i, ch := range order {
		r := result(t, ch)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		r.permit.Release()
	}
	s := l.Stats()
	if s.Shed[ReasonEvicted][PrioritySheddable] != 2 || s.Shed[ReasonQueueFull][PrioritySheddable] != 1 ||
		s.Shed[ReasonQueueFull][PriorityDefault] != 1 {
		t.Fatalf("shed counters %v", s.Shed)
	}
}

// TestCriticalKeepsReserveWhenSheddableFloods: with a limit of 10 and a 20%
// reserve, sheddable traffic can hold at most 8 slots and fill the queue,
// yet critical requests are admitted at once into the 2 reserved slots and,
// beyond that, are served before every queued sheddable.
func TestCriticalKeepsReserveWhenSheddableFloods(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 10, CriticalReservePercent: 20, MaxQueue: 4, QueueHardLimit: 8,
		QueueTimeout: time.Hour, Rand: rand.NewPCG(7, 7)})
	ctx := context.Background()

	var sheddable []Permit
	for range 8 {
		sheddable = append(sheddable, mustAcquire(t, l, PrioritySheddable))
	}
	// The flood: 50 more sheddable arrivals. Some queue (up to the hard
	// limit of 8), the rest are shed by the lottery or the full queue.
	var queued []<-chan acquireResult
	shedCount := 0
	for range 50 {
		before := l.QueueDepth()
		ch := make(chan acquireResult, 1)
		go func() {
			p, err := l.Acquire(ctx, PrioritySheddable)
			ch <- acquireResult{p, err}
		}()
		testenv.WaitFor(t, "the acquire to queue", func() bool { return l.QueueDepth() == before+1 || len(ch) > 0 })
		if l.QueueDepth() == before+1 {
			queued = append(queued, ch)
			continue
		}
		r := <-ch
		if !errors.Is(r.err, ErrShed) {
			t.Fatalf("sheddable flood: %v", r.err)
		}
		shedCount++
	}
	if got := l.InFlight(); got != 8 {
		t.Fatalf("in flight under sheddable flood = %d, want 8 (2 reserved)", got)
	}
	t.Logf("flood: %d queued, %d shed", len(queued), shedCount)

	// Critical gets the reserved slots without waiting.
	c1 := mustAcquire(t, l, PriorityCritical)
	c2 := mustAcquire(t, l, PriorityCritical)
	// A third critical queues (evicting a sheddable if the queue is full)
	// and is first in line.
	var c3 <-chan acquireResult
	if depth := l.QueueDepth(); depth < 8 {
		c3 = acquireQueued(t, ctx, l, PriorityCritical, depth+1)
	} else {
		ch := make(chan acquireResult, 1)
		go func() {
			p, err := l.Acquire(ctx, PriorityCritical)
			ch <- acquireResult{p, err}
		}()
		// The queue is full: the critical arrival pushes a sheddable out.
		testenv.WaitFor(t, "the queued acquire to be evicted", func() bool { return l.Stats().Shed[ReasonEvicted][PrioritySheddable] == 1 || len(ch) > 0 })
		c3 = ch
	}
	sheddable[0].Release()
	r := result(t, c3)
	if r.err != nil {
		t.Fatalf("third critical: %v", r.err)
	}
	// A slot freed by critical at in-flight 10 drops to 9: above the
	// non-critical threshold of 8, so no sheddable gets it.
	c1.Release()
	if got := l.InFlight(); got != 9 {
		t.Fatalf("in flight after critical release = %d, want 9 (reserved slot kept free)", got)
	}
	// Release everything; the queued sheddables drain.
	c2.Release()
	r.permit.Release()
	for _, p := range sheddable[1:] {
		p.Release()
	}
	for _, ch := range queued {
		r := result(t, ch)
		if r.err == nil {
			r.permit.Release()
		} else if !errors.Is(r.err, ErrShed) {
			t.Fatalf("queued sheddable: %v", r.err)
		}
	}
	if l.InFlight() != 0 || l.QueueDepth() != 0 {
		t.Fatalf("drained: in flight %d, queue %d", l.InFlight(), l.QueueDepth())
	}
}

func TestReserveArithmetic(t *testing.T) {
	for _, tc := range []struct{ limit, pct, want int64 }{
		{1, 10, 0}, {2, 10, 1}, {5, 10, 1}, {10, 10, 1}, {11, 10, 2}, {100, 10, 10}, {10, 0, 0}, {3, 99, 2},
	} {
		if got := reserveFor(tc.limit, tc.pct); got != tc.want {
			t.Errorf("reserveFor(%d, %d%%) = %d, want %d", tc.limit, tc.pct, got, tc.want)
		}
	}
}

func TestRaisingTheLimitAdmitsQueuedRequests(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 4, QueueTimeout: time.Hour})
	held := mustAcquire(t, l, PriorityDefault)
	ch := acquireQueued(t, context.Background(), l, PriorityDefault, 1)
	l.setLimit(3)
	r := result(t, ch)
	if r.err != nil {
		t.Fatalf("queued after raise: %v", r.err)
	}
	r.permit.Release()
	held.Release()
}

// A slot freed by a Release that has not yet reached its dispatch (frozen
// here by decrementing in-flight by hand) goes to the queued request, not to
// a newcomer of the same priority.
func TestNewcomerDoesNotJumpTheQueue(t *testing.T) {
	env := newManualEnv()
	l := env.limiter(t, Config{MaxInFlight: 1, MaxQueue: 4, QueueTimeout: time.Hour})
	mustAcquire(t, l, PriorityDefault) // released by hand below
	queued := acquireQueued(t, context.Background(), l, PriorityDefault, 1)

	l.inFlight.Add(-1) // the first half of Release
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Acquire(ctx, PriorityDefault)
	wantShed(t, err, ReasonCanceled) // it queued behind, and left
	r := result(t, queued)
	if r.err != nil {
		t.Fatalf("queued request: %v", r.err)
	}
	r.permit.Release()
	if l.InFlight() != 0 {
		t.Fatalf("in flight = %d, want 0", l.InFlight())
	}
}
