package l7

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// Pending is the middleware's decision on one request's local rules while
// the caller still has other limits to ask (the Redis backend): the local
// rules are decided all-or-nothing and, when they all admit, charged, and
// the caller then settles the request with Commit (it passes) or Refund
// (another backend refused it, so the local charge is given back). Respond
// writes the headers of the local and the other limits together. Keep it
// on the caller's stack; it is about 1.2 KiB and not safe for concurrent
// use.
type Pending struct {
	verdict
	charges [MaxChecks]undo
}

// verdict is a request's decision on its local rules; Pending adds what a
// refund needs. The middleware's own path (Wrap, Check) settles at once and
// keeps only a verdict on its stack.
type verdict struct {
	m       *Middleware
	t       *tier
	n       int // enforced rules applied
	skipped bool
	allowed bool
	settled bool
	applied [MaxChecks]*rule
	checks  [MaxChecks]Check
	out     [MaxChecks]Decision
	full    [MaxChecks]bool
}

// ExternalDecision is one limit decided outside the middleware, reported in
// the same RateLimit headers and 429 as the local rules (after them).
type ExternalDecision struct {
	// Name is the rule's name (ValidName).
	Name string
	// Policy is its RateLimit-Policy item, from PolicyItem.
	Policy string
	// Decision is its decision for this request.
	Decision Decision
}

// PolicyItem returns the RateLimit-Policy item of a limit: `"name";q=limit;w=seconds`,
// the window rounded up to whole seconds.
func PolicyItem(name string, limit int64, window time.Duration) string {
	return fmt.Sprintf("%q;q=%d;w=%d", name, limit, ceilDiv(int64(window), int64(time.Second)))
}

// Decide decides r's local rules (its tier's, all-or-nothing, shadow rules
// charged on their own) into p and charges them when they all admit. A
// request on a skipped path gets Skipped. Rejections are counted here;
// admissions when the caller settles p with Commit.
func (m *Middleware) Decide(r *http.Request, p *Pending) {
	m.decide(r, &p.verdict, &p.charges, false)
}

// DecideOutsideReserve is Decide for a request that may not use the rules'
// reserves (Rule.Reserve: a request outside the first class of the L7
// ranking, internal/l7/class): a rule that would be left with fewer than
// its reserve refuses it (429, Retry-After the time until the reserve and
// the request's cost are back, from the rule's rate).
func (m *Middleware) DecideOutsideReserve(r *http.Request, p *Pending) {
	m.decide(r, &p.verdict, &p.charges, m.reserves)
}

// decide is Decide; charges, if not nil, receives what an admitted request
// took, for Refund. outside: the rules' reserves are not the request's.
func (m *Middleware) decide(r *http.Request, p *verdict, charges *[MaxChecks]undo, outside bool) {
	p.m, p.n, p.settled = m, 0, false
	if len(m.skip) > 0 {
		if _, ok := m.skip[r.URL.Path]; ok {
			p.skipped, p.allowed = true, true
			return
		}
	}
	if m.skipFn != nil && m.skipFn(r) {
		p.skipped, p.allowed = true, true
		return
	}
	p.skipped = false
	t := m.tierFor(r)
	p.t = t
	now := m.clock.Now()
	n := 0
	for _, ru := range t.rules {
		key, ok := ru.key(r)
		if !ok {
			continue
		}
		if ru.shadow {
			if !ru.store.Take(key, now, ru.cost).Allowed {
				ru.counter.shadowRejected.Add(1)
			}
			continue
		}
		p.checks[n] = Check{Store: ru.store, Key: key, N: ru.cost, Reserve: ru.reserve}
		p.applied[n] = ru
		n++
	}
	p.n = n
	if n == 0 {
		p.allowed = true
		return
	}
	if outside {
		p.allowed = m.takeOutsideReserve(now, p, charges)
	} else {
		p.allowed = takeAll(now, p.checks[:n], p.out[:n], &p.full, charges)
	}
	if p.allowed {
		return
	}
	p.settled = true
	for i := range n {
		switch {
		case p.full[i]:
			p.applied[i].counter.rejectedFull.Add(1)
		case !p.out[i].Allowed:
			p.applied[i].counter.rejected.Add(1)
		}
	}
}

// takeOutsideReserve is takeAll for a request that may not use the rules'
// reserves.
func (m *Middleware) takeOutsideReserve(now int64, p *verdict, charges *[MaxChecks]undo) bool {
	return takeOutsideReserve(m.clock, now, p.checks[:p.n], p.out[:p.n], &p.full, charges)
}

// takeOutsideReserve is takeAll for a request outside the first class of
// the L7 ranking: a charge that leaves a check under its Reserve is given
// back and the request refused, each such check with a Retry-After that
// brings its reserve and the request's cost back (from the limit's rate).
// The proxy's routes (Middleware.DecideOutsideReserve) and the rate-limit
// service (TakeAllOutsideReserve) both decide through it.
func takeOutsideReserve(clock Clock, now int64, checks []Check, out []Decision, full *[MaxChecks]bool, charges *[MaxChecks]undo) bool {
	var local [MaxChecks]undo
	if charges == nil {
		charges = &local
	}
	if !takeAll(now, checks, out, full, charges) {
		return false
	}
	into := false
	for i := range checks {
		if r := checks[i].Reserve; r > 0 && out[i].Remaining < r {
			into = true
		}
	}
	if !into {
		return true
	}
	refundAll(clock, checks, charges, out)
	for i := range checks {
		r, cost, d := checks[i].Reserve, checks[i].N, &out[i]
		if r == 0 || d.Remaining >= r+cost {
			continue
		}
		d.Allowed = false
		need := r + cost - max(d.Remaining, 0)
		d.RetryAfter = time.Duration(float64(need) * float64(d.Window) / float64(max(d.Limit, 1)))
	}
	return false
}

// Skipped reports whether r is exempt (SkipPaths, Skip): not limited, no
// headers.
func (p *Pending) Skipped() bool { return p.skipped }

// Allowed reports whether every local rule admitted the request.
func (p *Pending) Allowed() bool { return p.allowed }

// Refused is the name of the first enforced local rule that refused the
// request ("" when none did), for the access log.
func (p *Pending) Refused() string {
	for i := range p.n {
		if !p.out[i].Allowed && p.applied[i] != nil {
			return p.applied[i].name
		}
	}
	return ""
}

// Tier is the name of the tier the request was decided in ("" for the
// route's rules alone).
func (p *Pending) Tier() string {
	if p.t == nil {
		return ""
	}
	return p.t.name
}

// Commit settles an admitted request that passes: the local charges stay
// and the rules count it as allowed. It does nothing for a rejected or
// already settled Pending.
func (p *Pending) Commit() { p.commit() }

func (p *verdict) commit() {
	if p.settled || !p.allowed {
		return
	}
	p.settled = true
	for i := range p.n {
		p.applied[i].counter.allowed.Add(1)
	}
}

// Delay is how long the request must be held before it is passed on: the
// longest release wait over its shaping rules (Rule.Shape), 0 when none
// shapes. Ask it after Commit (it means nothing for a refunded request).
func (p *Pending) Delay() time.Duration {
	if !p.allowed {
		return 0
	}
	var d time.Duration
	for i := range p.n {
		if sh := p.applied[i].shaper; sh != nil {
			d = max(d, sh.Delay(p.out[i], p.applied[i].cost))
		}
	}
	return d
}

// Refund settles an admitted request that another backend refused: every
// local charge is given back (Algorithm.Refund, under the same shard
// locks, at a time read once they are held) and the local decisions are
// replaced by the rules' state after the refund, for the headers. Shadow
// rules keep their charge, as they do for any rejected request. It does
// nothing for a rejected or already settled Pending.
func (p *Pending) Refund() {
	if p.settled || !p.allowed {
		return
	}
	p.settled = true
	if p.n > 0 {
		refundAll(p.m.clock, p.checks[:p.n], &p.charges, p.out[:p.n])
	}
}

// Respond writes the rate-limit headers of p's local rules followed by
// ext, and, when a local rule or an external decision refused the request,
// the whole 429 (Retry-After the longest wait over every refused limit,
// violated-policies naming them, local first). It reports whether the
// request may proceed. A skipped request gets nothing written. Settle p
// (Commit or Refund) before calling it.
func (m *Middleware) Respond(w http.ResponseWriter, p *Pending, ext []ExternalDecision) bool {
	return m.respond(w, &p.verdict, ext)
}

func (m *Middleware) respond(w http.ResponseWriter, p *verdict, ext []ExternalDecision) bool {
	if p.skipped {
		return true
	}
	allowed := p.allowed
	for i := range ext {
		allowed = allowed && ext[i].Decision.Allowed
	}
	if p.n+len(ext) == 0 {
		return allowed
	}
	m.writeHeaders(w, p, ext)
	if allowed {
		return true
	}
	var retry int64
	violated := make([]string, 0, 2)
	for i := range p.n {
		if !p.out[i].Allowed {
			violated = append(violated, p.applied[i].name)
			retry = max(retry, retrySeconds(p.out[i].RetryAfter))
		}
	}
	for i := range ext {
		if !ext[i].Decision.Allowed {
			violated = append(violated, ext[i].Name)
			retry = max(retry, retrySeconds(ext[i].Decision.RetryAfter))
		}
	}
	if m.jitterSec > 0 {
		retry += rand.Int64N(m.jitterSec + 1)
	}
	WriteProblem(w, Problem{
		Type:             ProblemTypeQuotaExceeded,
		Title:            "Request cannot be satisfied as assigned quota has been exceeded",
		Status:           http.StatusTooManyRequests,
		ViolatedPolicies: violated,
	}, retry)
	return false
}
