package redislimit

import (
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// localRule is the Degrade policy's in-process limit: the rule's algorithm
// with Limit÷N (and Burst÷N), at least 1, on the injected clock. It is a
// small copy of the Redis scripts' arithmetic (the l7 package's algorithms
// were being written at the same time); it only runs while Redis is away.
//
// Memory: one localState (40 bytes + map overhead, ~100 bytes) per client
// key, at most maxKeys. When full, idle keys are swept; if none is idle, new
// keys share one overflow state, so a flood of new keys is limited as one.
type localRule struct {
	limit    int64 // per window, after ÷N
	burst    int64 // GCRA depth, after ÷N
	interval int64 // GCRA emission interval, ns
	windowUS int64 // SWC window, µs
	alg      Algorithm
	window   time.Duration
	maxKeys  int

	mu     sync.Mutex
	states map[string]*localState
}

type localState struct {
	tat             int64 // GCRA, clock ns
	idx, prev, curr int64 // SWC
}

const overflowKey = "\x00overflow"

func newLocalRule(r Rule, maxKeys int) *localRule {
	n := max(r.DegradeShards, 1)
	l := &localRule{
		limit:    max(r.Limit/n, 1),
		burst:    max(r.burst()/n, 1),
		alg:      r.Algorithm,
		window:   r.Window,
		windowUS: max(int64(r.Window/time.Microsecond), 1),
		maxKeys:  maxKeys,
		states:   map[string]*localState{},
	}
	l.interval = max(int64(r.Window)/l.limit, 1)
	return l
}

// localCheck is one rule's verdict before anything is charged.
type localCheck struct {
	rule     *localRule
	state    *localState
	decision l7.Decision
	newTAT   int64
	idx      int64
	prev     int64
	curr     int64
}

// check computes the verdict for key at now; the caller holds l.mu.
func (l *localRule) check(key string, now int64) localCheck {
	st := l.stateLocked(key, now)
	c := localCheck{rule: l, state: st}
	d := l7.Decision{Limit: l.limit, Window: l.window}
	switch l.alg {
	case GCRA:
		T := l.interval
		tat := max(st.tat, now)
		nd := tat - now + T
		wait := nd - l.burst*T
		if wait > 0 {
			d.Remaining = max((l.burst*T-(tat-now))/T, 0)
			d.Reset = time.Duration(tat - now)
			d.RetryAfter = time.Duration(wait)
		} else {
			d.Allowed = true
			d.Remaining = -wait / T
			d.Reset = time.Duration(nd)
			c.newTAT = now + nd
		}
	default:
		W := l.windowUS
		nowUS := now / 1000
		idx, r := nowUS/W, nowUS%W
		prev, curr := int64(0), int64(0)
		switch st.idx {
		case idx:
			prev, curr = st.prev, st.curr
		case idx - 1:
			prev = st.curr
		}
		rem := (l.limit*W-prev*(W-r))/W - curr
		resetUS := func(c int64) int64 {
			switch {
			case c > 0:
				return 2*W - r
			case prev > 0:
				return W - r
			}
			return 0
		}
		if rem < 1 {
			var retry int64
			switch avail := l.limit - curr - 1; {
			case avail >= 0:
				retry = W - avail*W/prev - r
			case curr <= l.limit-1:
				retry = W - r
			default:
				retry = 2*W - r - (l.limit-1)*W/curr
			}
			d.Remaining = max(rem, 0)
			d.Reset = time.Duration(resetUS(curr)) * time.Microsecond
			d.RetryAfter = time.Duration(retry) * time.Microsecond
		} else {
			d.Allowed = true
			d.Remaining = rem - 1
			d.Reset = time.Duration(resetUS(curr+1)) * time.Microsecond
			c.idx, c.prev, c.curr = idx, prev, curr+1
		}
	}
	c.decision = d
	return c
}

// commit charges a check that allowed; the caller holds l.mu.
func (c localCheck) commit() {
	if c.rule.alg == GCRA {
		c.state.tat = c.newTAT
		return
	}
	c.state.idx, c.state.prev, c.state.curr = c.idx, c.prev, c.curr
}

func (l *localRule) stateLocked(key string, now int64) *localState {
	if st, ok := l.states[key]; ok {
		return st
	}
	if len(l.states) >= l.maxKeys {
		l.sweepLocked(now)
		if len(l.states) >= l.maxKeys {
			key = overflowKey
			if st, ok := l.states[key]; ok {
				return st
			}
		}
	}
	st := &localState{idx: -2}
	l.states[key] = st
	return st
}

// sweepLocked drops states that no longer limit anything.
func (l *localRule) sweepLocked(now int64) {
	idx := now / 1000 / l.windowUS
	for k, st := range l.states {
		if (l.alg == GCRA && st.tat <= now) || (l.alg != GCRA && st.idx < idx-1) {
			delete(l.states, k)
		}
	}
}

// uncharge gives back one request charged to a sliding window in window idx.
func (l *localRule) uncharge(key string, idx int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st, ok := l.states[key]; ok && st.idx == idx && st.curr > 0 {
		st.curr--
	}
}
