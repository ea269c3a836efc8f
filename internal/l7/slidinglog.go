package l7

import (
	"fmt"
	"time"
)

// SlidingLog is the sliding log: the time of every unit admitted in the
// last Window, per key. A request for n units at time now is admitted iff
// the units admitted in (now-Window, now] plus n are at most Limit: exact,
// no approximation (an admitted unit at t counts until t+Window, not
// later). It is the reference the counter algorithms approximate.
//
// Memory: the log of a key is a ring of Limit timestamps (8 bytes each),
// allocated the first time its Store slot holds admitted units and reused
// by the keys that later take that slot; a Store of capacity C holds at
// most about C*Limit*8 bytes of logs. MaxSlidingLogLimit bounds Limit.
//
// State: State[0] is the time of the newest admitted batch; State[1]
// packs the ring's head (bits 0-20), the number of logged timestamps
// (bits 21-41) and the units of the newest batch (bits 42-62), which are
// written into the ring only by the next Take. A rejected or rolled back
// Take therefore leaves nothing behind: the ring positions a Take writes
// lie outside the log its state describes, and it writes there what any
// later Take from that state would write (the Store relies on this for
// all-or-nothing multi-limit checks).
//
// Take and Refund through the Algorithm interface see only a key's state,
// not its log: they are exact for a key with nothing logged yet (a fresh
// state) and are used that way only (validation). The Store gives every
// key its log (takeLog, refundLog).
type SlidingLog struct {
	limit  int64
	window int64
}

// MaxSlidingLogLimit bounds a sliding log's Limit (the ring's size and the
// bits of its state).
const MaxSlidingLogLimit = 1 << 20

const (
	slBits = 21
	slMask = 1<<slBits - 1
)

// NewSlidingLog returns a sliding log admitting limit units per window.
func NewSlidingLog(limit int64, window time.Duration) (*SlidingLog, error) {
	if err := validate("sliding_log", limit, window); err != nil {
		return nil, err
	}
	if limit > MaxSlidingLogLimit {
		return nil, fmt.Errorf("sliding_log: limit %d above %d (one timestamp per admitted request is kept): %w",
			limit, MaxSlidingLogLimit, ErrInvalidLimit)
	}
	return &SlidingLog{limit: limit, window: int64(window)}, nil
}

// Name returns "sliding_log".
func (l *SlidingLog) Name() string { return "sliding_log" }

// Limit returns units per window.
func (l *SlidingLog) Limit() int64 { return l.limit }

// Window returns the window.
func (l *SlidingLog) Window() time.Duration { return time.Duration(l.window) }

func slUnpack(s State) (head, count, pending int64) {
	return s[1] & slMask, s[1] >> slBits & slMask, s[1] >> (2 * slBits) & slMask
}

func slPack(at, head, count, pending int64) State {
	return State{at, head | count<<slBits | pending<<(2*slBits)}
}

// Take implements Algorithm for a key with nothing logged (see the type's
// documentation): a fresh state.
func (l *SlidingLog) Take(s State, now, n int64) (State, Decision) {
	var d Decision
	if s[1] != 0 {
		// Not reached from the Store, which passes the key's log; refuse
		// rather than guess.
		return s, Decision{Limit: l.limit, Window: time.Duration(l.window), RetryAfter: time.Duration(l.window)}
	}
	return l.takeLog(s, nil, now, n, &d), d
}

// Refund implements Algorithm for a key with nothing logged but its
// newest batch.
func (l *SlidingLog) Refund(cur, before, after State, now int64) State {
	return l.refundLog(cur, before, after, nil, now)
}

// Idle implements Algorithm: a key is fresh once its newest units have
// slid out of the window (every older one has too).
func (l *SlidingLog) Idle(s State, now int64) bool {
	return s[1] == 0 || now >= s[0]+l.window
}

// flush writes the newest batch of s into ring and returns the state that
// logs it. It writes only outside the log s describes.
func (l *SlidingLog) flush(s State, ring []int64) (head, count int64) {
	head, count, pending := slUnpack(s)
	if pending == 0 {
		return head, count
	}
	for j := range pending {
		ring[(head+count+j)%l.limit] = s[0]
	}
	return head, count + pending
}

// takeLog is Take with the key's ring (len Limit; nil only for a fresh
// state, whose ring is never read).
func (l *SlidingLog) takeLog(s State, ring []int64, now, n int64, d *Decision) State {
	*d = Decision{Limit: l.limit, Window: time.Duration(l.window)}
	now = max(now, s[0]) // a stale clock never counts units twice
	var head, count int64
	if s[1] != 0 {
		head, count = l.flush(s, ring)
		cutoff := now - l.window
		for count > 0 && ring[head] <= cutoff {
			head = (head + 1) % l.limit
			count--
		}
	}
	if count > 0 {
		// The newest logged unit is s[0]'s batch.
		d.Reset = time.Duration(s[0] + l.window - now)
	}
	if n > l.limit || count+n > l.limit {
		d.Remaining = l.limit - count
		if n > l.limit {
			d.RetryAfter = Never
		} else {
			// The (count+n-limit)-th oldest unit must slide out first.
			oldest := ring[(head+count+n-l.limit-1)%l.limit]
			d.RetryAfter = time.Duration(oldest + l.window - now)
		}
		return s
	}
	d.Allowed = true
	d.Remaining = l.limit - count - n
	if n == 0 {
		return s
	}
	d.Reset = time.Duration(l.window)
	return slPack(now, head, count, n)
}

// refundLog gives back the units of the Take that moved a key from
// before to after, at now, from its current state cur and ring: units of
// the newest batch or logged timestamps equal to after's batch time that
// are still in the window (equal timestamps are interchangeable), and the
// log is compacted over them (O(Limit)). When nothing touched the key since
// (cur == after) that is exactly after's batch: the key then decides every
// later request as before would. (Returning before itself would not do:
// its log may lie in ring positions that after's flushes have reused.)
func (l *SlidingLog) refundLog(cur, before, after State, ring []int64, now int64) State {
	_, _, n := slUnpack(after)
	at := after[0]
	if n == 0 || now >= at+l.window {
		return cur // nothing charged, or it has slid out already
	}
	head, count, pending := slUnpack(cur)
	if cur[0] == at && pending > 0 {
		k := min(n, pending)
		pending -= k
		n -= k
	}
	if n > 0 && count > 0 && ring != nil {
		// The run of timestamps equal to at, scanning from the newest.
		end := count // one past the run, relative to head
		for end > 0 && ring[(head+end-1)%l.limit] > at {
			end--
		}
		start := end
		for start > 0 && ring[(head+start-1)%l.limit] == at {
			start--
		}
		k := min(n, end-start)
		if k > 0 {
			// Move the units older than the run k slots towards the
			// newest end, over the run's first k.
			for j := start - 1; j >= 0; j-- {
				ring[(head+j+k)%l.limit] = ring[(head+j)%l.limit]
			}
			head = (head + k) % l.limit
			count -= k
		}
	}
	// The newest time stays: a later Take with a stale clock is decided
	// at it, as before the refund.
	return slPack(cur[0], head, count, pending)
}
