package redislimit

import (
	"context"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// hybridRule is a hybrid rule as one Limiter decides it: its index among
// the Limiter's rules, and its lease state, which Limiters deciding the
// same limit share (HybridStates).
type hybridRule struct {
	index int
	*hybridState
	// decided counts the lease's own decisions (the metric's children
	// for this rule, looked up once): [0] allow, [1] deny.
	decided [2]prometheus.Counter
}

// countDecided counts one decision from the lease.
func (h *hybridRule) countDecided(allowed bool) {
	if allowed {
		h.decided[0].Inc()
	} else {
		h.decided[1].Inc()
	}
}

// HybridStates holds hybrid rules' lease state by rule name, for Limiters
// that decide the same limit on the same Redis keys: a route's (or an
// rls rule's) limit built into the route's limiter and into each tier's.
// A Limiter given it (Config.HybridStates) decides a hybrid rule with the
// state of an identical rule of the same name an earlier Limiter left
// there, so one host holds one lease per key and limit, whatever tier
// decides the request (two states on one key would take each other's
// counts for another host's). A rule that differs from the one of its
// name already there keeps a state of its own. The first Limiter still
// open that uses a state flushes it in the background; Close of one does
// not drop the leases the others use. Safe for concurrent use.
type HybridStates struct {
	mu sync.Mutex
	by map[string]*hybridState
}

// NewHybridStates returns an empty set of shared hybrid states.
func NewHybridStates() *HybridStates { return &HybridStates{by: map[string]*hybridState{}} }

// state is the state l decides rule r with: the one r's name has in s if
// its rule is r, else a new one (kept in s if the name is free). l is
// added to its users.
func (s *HybridStates) state(r Rule, l *Limiter, now int64) *hybridState {
	var h *hybridState
	if s != nil {
		s.mu.Lock()
		if have, ok := s.by[r.Name]; ok && sameRule(have.rule, r) {
			h = have
		} else if !ok {
			h = newHybridState(r, now)
			s.by[r.Name] = h
		}
		s.mu.Unlock()
	}
	if h == nil {
		h = newHybridState(r, now)
	}
	h.usersMu.Lock()
	h.users = append(h.users, l)
	h.usersMu.Unlock()
	return h
}

// sameRule reports whether a and b are the same hybrid rule.
func sameRule(a, b Rule) bool {
	if a.Hybrid == nil || b.Hybrid == nil || *a.Hybrid != *b.Hybrid {
		return false
	}
	a.Hybrid, b.Hybrid = nil, nil
	return a == b
}

// degrade is the local limit the rule falls back to (Degrade) with this
// state: the first user's lr, so every Limiter sharing the leases also
// shares the fallback (one host's rate ÷ hosts, whatever tier decides).
func (h *hybridState) degrade(lr *localRule) *localRule {
	h.usersMu.Lock()
	defer h.usersMu.Unlock()
	if h.local == nil {
		h.local = lr
	}
	return h.local
}

// flusher reports whether l flushes h in the background: the first of its
// users still open.
func (h *hybridState) flusher(l *Limiter) bool {
	h.usersMu.Lock()
	defer h.usersMu.Unlock()
	return len(h.users) > 0 && h.users[0] == l
}

// release removes l from h's users (its Close).
func (h *hybridState) release(l *Limiter) {
	h.usersMu.Lock()
	defer h.usersMu.Unlock()
	h.users = slices.DeleteFunc(h.users, func(u *Limiter) bool { return u == l })
}

// backgroundSync is Sync for the hybrid states l flushes (the background
// flush: a shared state is flushed by one of its Limiters, not by each).
func (l *Limiter) backgroundSync(ctx context.Context) {
	l.sync(ctx, func(h *hybridRule) bool { return h.flusher(l) })
}
