package l7

import (
	"strconv"
	"time"
)

// Charges is what an admitted TakeAll charged, kept on the caller's stack
// so the caller can give it back (Refund) when another backend refuses the
// request: the rate-limit service (internal/l7/rls) decides a request's
// local limits with TakeAll and its Redis limits after, as the proxy's
// Pending does for a route.
type Charges struct {
	checks  [MaxChecks]Check
	charges [MaxChecks]undo
	n       int
}

// TakeAll decides checks all-or-nothing at clock's now, as the
// middleware's rules are decided (takeAll): the request is charged on
// every check only if every check admits it. out[i] receives check i's
// decision. When it admits and c is not nil, c records the charges for
// Refund. len(checks) must be at most MaxChecks.
func TakeAll(clock Clock, checks []Check, out []Decision, c *Charges) bool {
	if len(checks) == 0 {
		return true
	}
	var charges *[MaxChecks]undo
	if c != nil {
		charges = &c.charges
		c.n = 0
	}
	ok := takeAll(clock.Now(), checks, out, nil, charges)
	if ok && c != nil {
		c.n = copy(c.checks[:], checks)
	}
	return ok
}

// TakeAllOutsideReserve is TakeAll for a request outside the first class
// of the L7 ranking (internal/l7/class): it may not use the checks'
// Reserve, exactly as a proxy route's request outside it
// (Middleware.DecideOutsideReserve): a charge that would leave a check
// with fewer than its Reserve units is given back and the request refused
// (out[i].RetryAfter the time until the reserve and the cost are back).
func TakeAllOutsideReserve(clock Clock, checks []Check, out []Decision, c *Charges) bool {
	if len(checks) == 0 {
		return true
	}
	var charges *[MaxChecks]undo
	if c != nil {
		charges = &c.charges
		c.n = 0
	}
	ok := takeOutsideReserve(clock, clock.Now(), checks, out, nil, charges)
	if ok && c != nil {
		c.n = copy(c.checks[:], checks)
	}
	return ok
}

// Refund gives back what TakeAll charged (nothing if it refused or was
// refunded already) and writes each check's state after the refund to out.
func (c *Charges) Refund(clock Clock, out []Decision) {
	if c.n == 0 {
		return
	}
	refundAll(clock, c.checks[:c.n], &c.charges, out)
	c.n = 0
}

// AppendRateLimitItem appends one draft-10 RateLimit item for d
// (`"name";r=remaining;t=seconds`), as the middleware writes it: t is the
// wait until a refused request would be admitted, else until the quota is
// fully restored, in whole seconds rounded up.
func AppendRateLimitItem(buf []byte, name string, d Decision) []byte {
	buf = append(buf, '"')
	buf = append(buf, name...)
	buf = append(buf, `";r=`...)
	buf = strconv.AppendInt(buf, max(0, d.Remaining), 10)
	buf = append(buf, ";t="...)
	return strconv.AppendInt(buf, resetSeconds(d), 10)
}

// RetryAfterSeconds is the Retry-After value of a wait: whole seconds
// rounded up, at least 1 (a client retrying then is never early).
func RetryAfterSeconds(d time.Duration) int64 { return retrySeconds(d) }
