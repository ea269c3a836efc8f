package redislimit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// BreakerState is the circuit breaker's state, also exported as a gauge.
type BreakerState int32

const (
	// BreakerClosed: Redis is used for every decision.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: one probe is in flight; decisions still fall back.
	BreakerHalfOpen
	// BreakerOpen: Redis is known down; decisions fall back without any
	// network I/O until the open period ends.
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	}
	return "unknown"
}

// BreakerConfig tunes the circuit breaker. Zero fields take the defaults.
type BreakerConfig struct {
	// Failures is how many consecutive failed round trips open the
	// breaker. Default 3.
	Failures int
	// OpenFor is the first open period, after which one probe (PING) is
	// sent. Default 500ms.
	OpenFor time.Duration
	// MaxOpenFor caps the open period, which doubles after each failed
	// probe. Default 5s.
	MaxOpenFor time.Duration
	// ProbeTimeout bounds the probe. Default 250ms.
	ProbeTimeout time.Duration
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures <= 0 {
		c.Failures = 3
	}
	if c.OpenFor <= 0 {
		c.OpenFor = 500 * time.Millisecond
	}
	if c.MaxOpenFor < c.OpenFor {
		c.MaxOpenFor = max(5*time.Second, c.OpenFor)
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 250 * time.Millisecond
	}
	return c
}

// breaker decides, without network I/O, whether a round trip to Redis is
// worth attempting. Its lock is never held across I/O: the probe runs in
// its own goroutine and reports back through probeDone.
type breaker struct {
	cfg      BreakerConfig
	clock    l7.Clock
	onChange func(from, to BreakerState)

	state atomic.Int32 // fast path: closed needs no lock

	mu       sync.Mutex
	changes  []change // transitions to report once mu is released
	failures int
	until    int64 // end of the open period (clock ns)
	openFor  time.Duration
}

type change struct{ from, to BreakerState }

func newBreaker(cfg BreakerConfig, clock l7.Clock, onChange func(from, to BreakerState)) *breaker {
	cfg = cfg.withDefaults()
	return &breaker{cfg: cfg, clock: clock, onChange: onChange, openFor: cfg.OpenFor}
}

// State returns the current state.
func (b *breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// allow reports whether to attempt a round trip. probe is true for exactly
// one caller when an open period has ended: that caller must run a probe
// and report it with probeDone.
func (b *breaker) allow() (ok, probe bool) {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if b.clock.Now() >= b.until {
			b.setLocked(BreakerHalfOpen)
			return false, true
		}
	}
	return false, false
}

// retryIn is how long until the next probe, for fail-closed Retry-After.
func (b *breaker) retryIn() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := time.Duration(b.until - b.clock.Now()); d > 0 {
		return d
	}
	return 0
}

// success records a round trip that reached Redis.
func (b *breaker) success() {
	if BreakerState(b.state.Load()) == BreakerClosed {
		b.mu.Lock()
		b.failures = 0
		b.mu.Unlock()
		return
	}
	// A round trip started before the breaker opened may still succeed;
	// only the probe closes the breaker.
}

// failure records a round trip that did not reach Redis.
func (b *breaker) failure() {
	b.mu.Lock()
	defer b.unlock()
	if BreakerState(b.state.Load()) != BreakerClosed {
		return
	}
	b.failures++
	if b.failures >= b.cfg.Failures {
		b.openFor = b.cfg.OpenFor
		b.until = b.clock.Now() + int64(b.openFor)
		b.setLocked(BreakerOpen)
	}
}

// probeDone closes the breaker after a good probe, or reopens it for twice
// as long (capped) after a bad one.
func (b *breaker) probeDone(ok bool) {
	b.mu.Lock()
	defer b.unlock()
	if ok {
		b.failures = 0
		b.openFor = b.cfg.OpenFor
		b.setLocked(BreakerClosed)
		return
	}
	b.openFor = min(2*b.openFor, b.cfg.MaxOpenFor)
	b.until = b.clock.Now() + int64(b.openFor)
	b.setLocked(BreakerOpen)
}

func (b *breaker) setLocked(to BreakerState) {
	from := BreakerState(b.state.Swap(int32(to)))
	if from != to {
		b.changes = append(b.changes, change{from, to})
	}
}

// unlock releases mu, then reports transitions: onChange logs, and a log
// handler may do I/O, which must not happen under the lock.
func (b *breaker) unlock() {
	changes := b.changes
	b.changes = nil
	b.mu.Unlock()
	if b.onChange != nil {
		for _, c := range changes {
			b.onChange(c.from, c.to)
		}
	}
}
