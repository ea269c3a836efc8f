package l7

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// State is the per-key state of an Algorithm: two words, 16 bytes, whatever
// the algorithm. The zero State is a fresh key (full quota) for every
// algorithm, so a store can treat "no entry" and "zero entry" alike. Each
// algorithm documents what the two words mean.
type State [2]int64

// Never is the RetryAfter of a request that can never be admitted (it asks
// for more units than the limit's burst).
const Never = time.Duration(math.MaxInt64)

// Algorithm is a rate-limit algorithm as a pure function over a fixed-size
// per-key state. The same value is used by the single-key Limiter, the keyed
// Store, all-or-nothing multi-limit checks and the Redis backend's Go
// reference. Implementations are immutable after construction and safe for
// concurrent use.
type Algorithm interface {
	// Name is the algorithm's short name ("gcra", "sliding_window", ...).
	Name() string
	// Limit is the quota q: units admitted per Window.
	Limit() int64
	// Window is the quota's time window w.
	Window() time.Duration
	// Take decides whether n units may be taken at time now (ns) from state
	// s. When the decision is a rejection the returned state equals s:
	// rejected requests never consume quota. n == 0 only reports.
	Take(s State, now, n int64) (State, Decision)
	// Refund gives back the units of one admitted Take that moved a key
	// from before to after, applied to the key's current state cur at time
	// now (cur is after when nothing else touched the key since). It is
	// exact when cur == after: the result decides every later request as
	// before would. When other requests were admitted in between, the
	// result never admits more than the algorithm's definition applied to
	// the admitted requests other than the refunded one (it may admit less:
	// GCRA and TokenBucket then give back only the part of the charge that
	// provably did not drain while it was held). now must not be earlier
	// than the time of any Take applied to cur; the Store reads its clock
	// under the shard lock to make sure of it.
	Refund(cur, before, after State, now int64) State
	// Idle reports whether s is, at time now, indistinguishable from a fresh
	// key: dropping it changes no future decision. Stores evict only idle
	// keys, so eviction never resets a key that is currently limited.
	Idle(s State, now int64) bool
}

// ErrInvalidLimit is wrapped by every constructor error caused by bad
// parameters.
var ErrInvalidLimit = errors.New("invalid limit")

// maxScaled bounds products such as limit*window so the integer arithmetic
// of every algorithm stays inside int64 (and, summed three times, uint64).
const maxScaled = 1 << 62

func validate(alg string, limit int64, window time.Duration) error {
	if limit < 1 {
		return fmt.Errorf("%s: limit %d: must be at least 1: %w", alg, limit, ErrInvalidLimit)
	}
	if window <= 0 {
		return fmt.Errorf("%s: window %s: must be positive: %w", alg, window, ErrInvalidLimit)
	}
	if limit > maxScaled/int64(window) {
		return fmt.Errorf("%s: limit %d times window %s exceeds 2^62 ns: use a shorter window: %w",
			alg, limit, window, ErrInvalidLimit)
	}
	return nil
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1
}

// windowStart returns the start of the window of length w holding now
// (floor division, also correct for negative now).
func windowStart(now, w int64) int64 {
	r := now % w
	if r < 0 {
		r += w
	}
	return now - r
}
