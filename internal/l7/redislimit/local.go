package redislimit

import (
	"fmt"
	"sync"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// localRule is the Degrade policy's in-process limit: the rule's algorithm
// from package l7 (the same arithmetic as the Redis scripts, checked by
// TestLocalMatchesRedis) with Limit÷N and Burst÷N, at least 1, on the
// injected clock. It only runs while Redis is away.
//
// Memory: one l7.State (16 bytes, ~80 with its map entry and key) per client
// key, at most maxKeys. When full, idle keys are swept; if none is idle, new
// keys share one overflow state, so a flood of new keys is limited as one.
// A sweep that frees less than a sweepShare of the map is not repeated
// for the next that many new keys (they share the overflow state): a
// spray of new keys into a full map of busy ones costs a sweep per
// sweepShare of it, not one per request.
type localRule struct {
	alg     l7.Algorithm
	maxKeys int

	mu     sync.Mutex
	states map[string]*l7.State
	// unswept is how many more new keys arriving at a full map go to the
	// overflow state before the next sweep; sweeps counts them (tests).
	unswept, sweeps int
}

// sweepShare: a sweep that frees under 1/sweepShare of the map waits for
// that many new keys (maxKeys/sweepShare) before the next.
const sweepShare = 16

const overflowKey = "\x00overflow"

func newLocalRule(r Rule, maxKeys int) (*localRule, error) {
	n := max(r.DegradeShards, 1)
	var alg l7.Algorithm
	var err error
	switch r.Algorithm {
	case GCRA:
		alg, err = l7.NewGCRA(max(r.Limit/n, 1), r.Window, max(r.burst()/n, 1))
	default:
		alg, err = l7.NewSlidingWindow(max(r.Limit/n, 1), r.Window)
	}
	if err != nil {
		return nil, fmt.Errorf("rule %q: local limit for the degrade policy: %w", r.Name, err)
	}
	return &localRule{alg: alg, maxKeys: maxKeys, states: map[string]*l7.State{}}, nil
}

// localCheck is one rule's verdict before anything is charged.
type localCheck struct {
	rule     *localRule
	state    *l7.State
	old, new l7.State
	decision l7.Decision
}

// check computes the verdict for n units of key at now; the caller holds
// l.mu.
func (l *localRule) check(key string, now, n int64) localCheck {
	st := l.stateLocked(key, now)
	next, d := l.alg.Take(*st, now, n)
	return localCheck{rule: l, state: st, old: *st, new: next, decision: d}
}

// commit charges a check that allowed; the caller holds l.mu.
func (c localCheck) commit() { *c.state = c.new }

// undo gives a committed request back through the algorithm's Refund, at
// a time read under the lock (exact when nothing else touched the state;
// never more lenient than the limit without this request otherwise). A
// state swept meanwhile was idle: nothing is left to give back.
func (c localCheck) undo(clock l7.Clock) {
	c.rule.mu.Lock()
	defer c.rule.mu.Unlock()
	*c.state = c.rule.alg.Refund(*c.state, c.old, c.new, clock.Now())
}

func (l *localRule) stateLocked(key string, now int64) *l7.State {
	if st, ok := l.states[key]; ok {
		return st
	}
	if len(l.states) >= l.maxKeys {
		if l.unswept > 0 {
			l.unswept--
		} else if freed := l.sweepLocked(now); freed < l.maxKeys/sweepShare {
			l.unswept = l.maxKeys / sweepShare
		}
		if len(l.states) >= l.maxKeys {
			key = overflowKey
			if st, ok := l.states[key]; ok {
				return st
			}
		}
	}
	st := new(l7.State)
	l.states[key] = st
	return st
}

// sweepLocked drops states that no longer limit anything and returns
// how many.
func (l *localRule) sweepLocked(now int64) int {
	l.sweeps++
	freed := 0
	for k, st := range l.states {
		if l.alg.Idle(*st, now) {
			delete(l.states, k)
			freed++
		}
	}
	return freed
}
