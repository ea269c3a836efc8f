package shed

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultQueueTimeout           = time.Second
	DefaultCriticalReservePercent = 10
	// DefaultQueueHardLimitFactor: QueueHardLimit defaults to this many times
	// MaxQueue.
	DefaultQueueHardLimitFactor = 4
)

// Config configures one Limiter. Zero fields take the defaults above.
type Config struct {
	// MaxInFlight is the static concurrency limit. Ignored when Adaptive is
	// set (the limit then starts at Adaptive.InitialLimit).
	MaxInFlight int
	// Adaptive, when set, lets the limit follow measured latency (AIMD).
	Adaptive *AdaptiveConfig
	// MaxQueue is the queue depth beyond which arrivals are shed with
	// probability 1 - MaxQueue/depth. Zero disables the queue: a request
	// that finds no free slot is shed at once.
	MaxQueue int
	// QueueHardLimit caps the number of queued requests. Zero means
	// DefaultQueueHardLimitFactor*MaxQueue; it is raised to MaxQueue if lower.
	QueueHardLimit int
	// QueueTimeout is how long a request waits for a slot. Zero means
	// DefaultQueueTimeout.
	QueueTimeout time.Duration
	// CriticalReservePercent of the limit (rounded up, at most limit-1 slots)
	// is usable only by critical requests. Zero means
	// DefaultCriticalReservePercent; negative means no reserve.
	CriticalReservePercent int
	// Clock times latency samples for the adaptive limit. Nil means
	// l7.NewSystemClock().
	Clock l7.Clock
	// Rand draws the shedding lottery. It is only used under the limiter's
	// lock. Nil means a PCG seeded from the runtime's random source.
	Rand rand.Source
	// AfterFunc schedules queue timeouts: it runs f once after d unless the
	// returned stop func is called first. Nil means time.AfterFunc.
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	// Logger receives limit changes at debug level. Nil discards.
	Logger *slog.Logger
}

// Limiter bounds the requests in flight for one route (or the global limit). The fast path
// (a free slot and an empty queue) is one atomic compare-and-swap and takes
// no lock; only queueing and hand-off take the limiter's own mutex.
type Limiter struct {
	// Hot fields, read by every Acquire.
	inFlight atomic.Int64
	// waiting counts queued requests plus, transiently, the one acquirer
	// inside the slow path. Only changed under mu.
	waiting atomic.Int64
	limit   atomic.Int64
	// sharedLimit is limit minus the critical reserve: the threshold for
	// default and sheddable requests, kept next to limit so the fast path
	// does no division.
	sharedLimit atomic.Int64
	reservePct  int64
	adaptive    *aimd
	clock       l7.Clock
	admitted    [numPriorities]atomic.Uint64
	shed        [numReasons][numPriorities]atomic.Uint64
	maxQueue    int
	hardLimit   int
	timeout     time.Duration
	afterFunc   func(time.Duration, func()) func() bool
	log         *slog.Logger

	mu     sync.Mutex
	queues [numPriorities]waitList // by rank
	rnd    rand.Source
}

// New validates cfg and returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	l := &Limiter{
		maxQueue:  cfg.MaxQueue,
		hardLimit: cfg.QueueHardLimit,
		timeout:   cfg.QueueTimeout,
		clock:     cfg.Clock,
		rnd:       cfg.Rand,
		afterFunc: cfg.AfterFunc,
		log:       cfg.Logger,
	}
	if cfg.MaxQueue < 0 || cfg.QueueHardLimit < 0 || cfg.QueueTimeout < 0 {
		return nil, fmt.Errorf("shed: negative queue setting (max %d, hard limit %d, timeout %s)",
			cfg.MaxQueue, cfg.QueueHardLimit, cfg.QueueTimeout)
	}
	if l.hardLimit == 0 {
		l.hardLimit = DefaultQueueHardLimitFactor * l.maxQueue
	}
	l.hardLimit = max(l.hardLimit, l.maxQueue)
	if l.timeout == 0 {
		l.timeout = DefaultQueueTimeout
	}
	switch {
	case cfg.CriticalReservePercent == 0:
		l.reservePct = DefaultCriticalReservePercent
	case cfg.CriticalReservePercent < 0:
		l.reservePct = 0
	case cfg.CriticalReservePercent >= 100:
		return nil, fmt.Errorf("shed: critical reserve %d%% leaves nothing for other priorities", cfg.CriticalReservePercent)
	default:
		l.reservePct = int64(cfg.CriticalReservePercent)
	}
	if l.clock == nil {
		l.clock = l7.NewSystemClock()
	}
	if l.rnd == nil {
		l.rnd = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	if l.afterFunc == nil {
		l.afterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Adaptive != nil {
		a, err := newAIMD(*cfg.Adaptive)
		if err != nil {
			return nil, fmt.Errorf("shed: adaptive limit: %w", err)
		}
		l.adaptive = a
		l.storeLimit(a.limit)
		return l, nil
	}
	if cfg.MaxInFlight < 1 {
		return nil, fmt.Errorf("shed: max in-flight %d: must be at least 1 (or set Adaptive)", cfg.MaxInFlight)
	}
	l.storeLimit(int64(cfg.MaxInFlight))
	return l, nil
}

// Permit is a granted slot. Call Release exactly once when the request is
// done. The zero Permit's Release does nothing.
type Permit struct {
	l *Limiter
	// start is 1 + the clock reading at grant, kept only for requests the
	// adaptive limit samples; 0 means not sampled.
	start int64
}

// Release frees the slot, handing it to the first queued request that may
// take it, and records the latency sample for the adaptive limit.
func (p Permit) Release() {
	l := p.l
	if l == nil {
		return
	}
	if p.start != 0 {
		l.adaptive.observe(l.clock.Now() - (p.start - 1))
	}
	l.release()
}

// release frees one slot and hands it on if anyone is queued.
func (l *Limiter) release() {
	l.inFlight.Add(-1)
	// Acquirers enqueue under mu after publishing waiting and re-checking
	// inFlight; this load after our decrement therefore either sees them, or
	// they saw our free slot.
	if l.waiting.Load() > 0 {
		l.mu.Lock()
		l.dispatchLocked()
		l.mu.Unlock()
	}
}

// threshold is the in-flight count below which a request of priority p may
// take a slot.
func (l *Limiter) threshold(p Priority) int64 {
	if p == PriorityCritical {
		return l.limit.Load()
	}
	return l.sharedLimit.Load()
}

// storeLimit installs limit n. The two stores are not one atomic step: for
// an instant after a change a request may be judged against the old shared
// threshold and the new limit, never beyond the larger of the two limits.
func (l *Limiter) storeLimit(n int64) int64 {
	l.sharedLimit.Store(n - reserveFor(n, l.reservePct))
	return l.limit.Swap(n)
}

// reserveFor is the number of slots reserved for critical requests: pct of
// limit rounded up, leaving at least one slot for everyone else.
func reserveFor(limit, pct int64) int64 {
	r := (limit*pct + 99) / 100
	return min(r, limit-1)
}

// tryTake takes a slot if fewer than thr are in flight.
func (l *Limiter) tryTake(thr int64) bool {
	for {
		n := l.inFlight.Load()
		if n >= thr {
			return false
		}
		if l.inFlight.CompareAndSwap(n, n+1) {
			if l.adaptive != nil {
				l.adaptive.noteInFlight(n + 1)
			}
			return true
		}
	}
}

func (l *Limiter) grant(p Priority) Permit {
	n := l.admitted[p].Add(1)
	if l.adaptive != nil && n%l.adaptive.sampleEvery == 0 {
		// Offset by one so that a clock reading of 0 still counts as sampled.
		return Permit{l: l, start: l.clock.Now() + 1}
	}
	return Permit{l: l}
}

// Acquire admits a request of priority p or sheds it. With a free slot and
// an empty queue it returns at once without locking. Otherwise the request
// queues (subject to the shedding lottery and the hard limit) until a slot
// is handed to it, QueueTimeout passes, or ctx ends.
//
// Errors: ShedError for shed requests; an error matching both ErrShed and
// ctx.Err() when ctx ended while queued.
func (l *Limiter) Acquire(ctx context.Context, p Priority) (Permit, error) {
	if p >= numPriorities {
		p = PriorityDefault
	}
	if l.waiting.Load() == 0 {
		if l.tryTake(l.threshold(p)) {
			return l.grant(p), nil
		}
	}
	return l.acquireSlow(ctx, p)
}

func (l *Limiter) acquireSlow(ctx context.Context, p Priority) (Permit, error) {
	l.mu.Lock()
	l.waiting.Add(1)
	// Slots freed by a Release that has not reached its own dispatch yet
	// go to those already queued; only then may this request take one, and
	// only if nobody it would queue behind is still waiting.
	l.dispatchLocked()
	if l.aheadLocked(p.rank()) == 0 && l.tryTake(l.threshold(p)) {
		l.waiting.Add(-1)
		l.mu.Unlock()
		return l.grant(p), nil
	}
	if reason, shed := l.admitToQueueLocked(p); shed {
		l.waiting.Add(-1)
		l.mu.Unlock()
		l.shed[reason][p].Add(1)
		return Permit{}, ShedError(reason)
	}
	w := &waiter{prio: p, ready: make(chan struct{})}
	l.queues[p.rank()].pushBack(w)
	l.mu.Unlock()

	stop := l.afterFunc(l.timeout, func() { l.expire(w) })
	select {
	case <-w.ready:
	case <-ctx.Done():
		l.mu.Lock()
		if w.state == waiterQueued {
			l.removeLocked(w, waiterShed, ReasonCanceled)
		}
		l.mu.Unlock()
	}
	stop()
	// w.state is final: written under mu before ready was closed, or read
	// under mu above.
	switch {
	case w.state == waiterGranted && ctx.Err() != nil:
		// Granted as the context ended: give the slot back, unsampled.
		l.release()
		l.shed[ReasonCanceled][p].Add(1)
		return Permit{}, &canceledError{cause: context.Cause(ctx)}
	case w.state == waiterGranted:
		return l.grant(p), nil
	case w.reason == ReasonCanceled:
		return Permit{}, &canceledError{cause: context.Cause(ctx)}
	}
	return Permit{}, ShedError(w.reason)
}

// admitToQueueLocked decides whether a request of priority p that found no
// slot may queue, making room by evicting a lower-priority waiter if the
// queue is at its hard limit.
func (l *Limiter) admitToQueueLocked(p Priority) (Reason, bool) {
	if l.maxQueue == 0 {
		return ReasonAtLimit, true
	}
	r := p.rank()
	// The depth this request would see: everyone served before it, and
	// itself. Lower priorities queued behind it do not delay it.
	depth := l.aheadLocked(r) + 1
	total := int(l.queueDepthLocked())
	var victim *waiter
	if total >= l.hardLimit {
		if victim = l.evictionVictimLocked(r); victim == nil {
			return ReasonQueueFull, true
		}
	}
	if depth > l.maxQueue && !l.surviveLocked(depth) {
		return ReasonQueueShed, true
	}
	if victim != nil {
		l.removeLocked(victim, waiterShed, ReasonEvicted)
	}
	return 0, false
}

// aheadLocked counts queued requests that are served before a new one of
// rank r.
func (l *Limiter) aheadLocked(r int) int {
	n := 0
	for i := 0; i <= r; i++ {
		n += l.queues[i].n
	}
	return n
}

// surviveLocked draws the lottery: true with probability maxQueue/depth.
func (l *Limiter) surviveLocked(depth int) bool {
	// Lemire's multiply-shift maps a uniform 64-bit draw onto [0, depth);
	// the bias is below depth/2^64.
	hi, _ := bits.Mul64(l.rnd.Uint64(), uint64(depth))
	return hi < uint64(l.maxQueue)
}

// evictionVictimLocked picks the newest waiter of the lowest priority below
// rank r, or nil.
func (l *Limiter) evictionVictimLocked(r int) *waiter {
	for i := len(l.queues) - 1; i > r; i-- {
		if w := l.queues[i].tail; w != nil {
			return w
		}
	}
	return nil
}

// removeLocked takes a queued waiter out of the queue with a final state and
// wakes it.
func (l *Limiter) removeLocked(w *waiter, state waiterState, reason Reason) {
	l.queues[w.prio.rank()].remove(w)
	l.waiting.Add(-1)
	w.state = state
	w.reason = reason
	if state == waiterShed {
		l.shed[reason][w.prio].Add(1)
	}
	close(w.ready)
}

// expire sheds w if it is still queued when its timeout fires.
func (l *Limiter) expire(w *waiter) {
	l.mu.Lock()
	if w.state == waiterQueued {
		l.removeLocked(w, waiterShed, ReasonQueueTimeout)
	}
	l.mu.Unlock()
}

// dispatchLocked hands free slots to queued requests, highest priority first.
func (l *Limiter) dispatchLocked() {
	for {
		var w *waiter
		for i := range l.queues {
			if w = l.queues[i].head; w != nil {
				break
			}
		}
		if w == nil {
			return
		}
		// The head of the best queue is the only candidate: default and
		// sheddable share a threshold, and critical's is the highest.
		if !l.tryTake(l.threshold(w.prio)) {
			return
		}
		l.removeLocked(w, waiterGranted, 0)
	}
}

// setLimit installs a new concurrency limit and, if it grew, lets queued
// requests in.
func (l *Limiter) setLimit(n int64) {
	old := l.storeLimit(n)
	if n > old && l.waiting.Load() > 0 {
		l.mu.Lock()
		l.dispatchLocked()
		l.mu.Unlock()
	}
}

// InFlight returns the number of requests holding a slot.
func (l *Limiter) InFlight() int64 { return max(l.inFlight.Load(), 0) }

// QueueDepth returns the number of queued requests.
func (l *Limiter) QueueDepth() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queueDepthLocked()
}

func (l *Limiter) queueDepthLocked() int64 {
	var n int64
	for i := range l.queues {
		n += int64(l.queues[i].n)
	}
	return n
}

// Limit returns the current concurrency limit (static or adaptive).
func (l *Limiter) Limit() int64 { return l.limit.Load() }

// Stats is a snapshot of a limiter's counters.
type Stats struct {
	InFlight   int64
	QueueDepth int64
	Limit      int64
	Admitted   [numPriorities]uint64             // by Priority
	Shed       [numReasons][numPriorities]uint64 // by Reason, Priority
}

// Stats returns the limiter's current counters.
func (l *Limiter) Stats() Stats {
	s := Stats{InFlight: l.InFlight(), QueueDepth: l.QueueDepth(), Limit: l.Limit()}
	l.addCounters(&s)
	return s
}

func (l *Limiter) addCounters(s *Stats) {
	for p := range numPriorities {
		s.Admitted[p] += l.admitted[p].Load()
		for r := range numReasons {
			s.Shed[r][p] += l.shed[r][p].Load()
		}
	}
}

// Totals sums the counters: requests admitted, and requests shed for any
// reason.
func (s Stats) Totals() (admitted, shed uint64) {
	for p := range numPriorities {
		admitted += s.Admitted[p]
		for r := range numReasons {
			shed += s.Shed[r][p]
		}
	}
	return admitted, shed
}

type waiterState uint8

const (
	waiterQueued waiterState = iota
	waiterGranted
	waiterShed
)

// waiter is one queued request. Fields other than ready are guarded by the
// limiter's mu.
type waiter struct {
	prev, next *waiter
	prio       Priority
	state      waiterState
	reason     Reason
	ready      chan struct{} // closed when state becomes final
}

// waitList is an intrusive FIFO with O(1) removal from anywhere.
type waitList struct {
	head, tail *waiter
	n          int
}

func (q *waitList) pushBack(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

func (q *waitList) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}
