package l7

import (
	"fmt"
	"math"
	"time"
)

// FixedWindow counts units in aligned windows [k*Window, (k+1)*Window) and
// admits a request iff count+n <= Limit. State[0] is the current window's
// start, State[1] its count.
//
// Error bound: exact per aligned window, but up to 2*Limit units can pass in
// any unaligned Window (Limit at the end of one window, Limit at the start of
// the next): the boundary burst. Use SlidingWindow when that matters.
// Memory per key: 16 bytes of state.
type FixedWindow struct {
	limit  int64
	window int64
}

// NewFixedWindow returns a fixed window admitting limit units per window.
func NewFixedWindow(limit int64, window time.Duration) (*FixedWindow, error) {
	if err := validate("fixed_window", limit, window); err != nil {
		return nil, err
	}
	return &FixedWindow{limit: limit, window: int64(window)}, nil
}

// Name returns "fixed_window".
func (f *FixedWindow) Name() string { return "fixed_window" }

// Limit returns units per window.
func (f *FixedWindow) Limit() int64 { return f.limit }

// Window returns the window.
func (f *FixedWindow) Window() time.Duration { return time.Duration(f.window) }

// Take implements Algorithm.
func (f *FixedWindow) Take(s State, now, n int64) (State, Decision) {
	d := Decision{Limit: f.limit, Window: time.Duration(f.window)}
	// A request that read the clock before a concurrent one moved the key
	// into a later window is decided in that window: it must not reset it.
	now = max(now, s[0])
	start := windowStart(now, f.window)
	count := s[1]
	if s[0] != start {
		count = 0
	}
	d.Reset = time.Duration(start + f.window - now)
	if count+n > f.limit {
		d.Remaining = f.limit - count
		d.RetryAfter = d.Reset
		if n > f.limit {
			d.RetryAfter = Never
		}
		if count == 0 {
			d.Reset = 0
		}
		return s, d
	}
	d.Allowed = true
	d.Remaining = f.limit - count - n
	if count+n == 0 {
		d.Reset = 0
	}
	if n == 0 {
		return s, d
	}
	return State{start, count + n}, d
}

// Refund implements Algorithm: the refunded units leave the count of their
// window if that window is still the current one (a past window no longer
// decides anything). Exact whatever else was admitted meanwhile.
func (f *FixedWindow) Refund(cur, before, after State, now int64) State {
	now = max(now, cur[0], after[0])
	start := windowStart(now, f.window)
	count := func(s State) int64 {
		if s[0] == start {
			return s[1]
		}
		return 0
	}
	r := count(after) - count(before)
	c := count(cur)
	if r <= 0 || c == 0 {
		return cur
	}
	return State{start, max(0, c-r)}
}

// Idle implements Algorithm: a key is fresh once its window has ended.
func (f *FixedWindow) Idle(s State, now int64) bool {
	return s[1] == 0 || now >= s[0]+f.window
}

// SlidingWindow is the sliding window counter: counts for the previous and
// current aligned windows, the previous one weighted by the part of it still
// inside the sliding window. With e = now - currentWindowStart, a request
// for n units is admitted iff
//
//	prev*(1 - e/Window) + curr + n <= Limit
//
// evaluated exactly in integers as prev*(Window-e) + (curr+n)*Window <=
// Limit*Window (no rounding, no floats). State[0] is the current window's
// start; State[1] packs prev (high 32 bits) and curr (low 32 bits), so Limit
// is at most 2^32-1.
//
// Error bound: the formula assumes the previous window's requests were spread
// evenly. Against a true sliding log it can admit more (when the previous
// window's requests came late) or fewer (when they came early); the number
// admitted in any sliding Window is at most 2*Limit in the worst case and
// exactly Limit when traffic is uniform. It does stop the fixed-window
// boundary burst: right after a full window, prev*(Window-0) = Limit*Window
// already fills the quota. It is the recommended default with GCRA.
// Memory per key: 16 bytes of state.
type SlidingWindow struct {
	limit  int64
	window int64
}

// NewSlidingWindow returns a sliding window counter admitting limit units per
// window.
func NewSlidingWindow(limit int64, window time.Duration) (*SlidingWindow, error) {
	if err := validate("sliding_window", limit, window); err != nil {
		return nil, err
	}
	if limit > math.MaxUint32 {
		return nil, fmt.Errorf("sliding_window: limit %d above 2^32-1: %w", limit, ErrInvalidLimit)
	}
	return &SlidingWindow{limit: limit, window: int64(window)}, nil
}

// Name returns "sliding_window".
func (w *SlidingWindow) Name() string { return "sliding_window" }

// Limit returns units per window.
func (w *SlidingWindow) Limit() int64 { return w.limit }

// Window returns the window.
func (w *SlidingWindow) Window() time.Duration { return time.Duration(w.window) }

// Counts returns the (previous, current) window counts of s as seen at now,
// after rolling the windows forward. Exported for the Redis backend's Go
// reference and for tests.
func (w *SlidingWindow) Counts(s State, now int64) (start, prev, curr int64) {
	start = windowStart(now, w.window)
	switch s[0] {
	case start:
		return start, int64(uint64(s[1]) >> 32), int64(uint32(s[1]))
	case start - w.window:
		return start, int64(uint32(s[1])), 0
	default:
		return start, 0, 0
	}
}

// Take implements Algorithm.
func (w *SlidingWindow) Take(s State, now, n int64) (State, Decision) {
	var d Decision
	return w.decideInto(s, now, n, &d), d
}

// decideInto is Take writing the decision through d (see decideInPlace).
func (w *SlidingWindow) decideInto(s State, now, n int64, d *Decision) State {
	*d = Decision{Limit: w.limit, Window: time.Duration(w.window)}
	// As in FixedWindow: a stale now never rolls the windows back.
	now = max(now, s[0])
	start, prev, curr := w.Counts(s, now)
	e := now - start
	win := uint64(w.window)
	quota := uint64(w.limit) * win
	// Every term is at most Limit*Window <= 2^62, so the sum fits a uint64.
	used := uint64(prev)*uint64(w.window-e) + uint64(curr)*win
	if n > w.limit || used+uint64(n)*win > quota {
		d.Remaining = int64((quota - min(used, quota)) / win)
		d.Reset = w.reset(prev, curr, e)
		if n > w.limit {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = w.retryAfter(prev, curr, e, n)
		}
		return s
	}
	d.Allowed = true
	d.Remaining = int64((quota - used - uint64(n)*win) / win)
	d.Reset = w.reset(prev, curr+n, e)
	if n == 0 {
		return s
	}
	return State{start, prev<<32 | (curr + n)}
}

// reset is the time until the weighted count is back to zero.
func (w *SlidingWindow) reset(prev, curr, e int64) time.Duration {
	switch {
	case curr > 0:
		return time.Duration(2*w.window - e)
	case prev > 0:
		return time.Duration(w.window - e)
	}
	return 0
}

// retryAfter is the exact time until n units would be admitted, assuming no
// other traffic: the earliest e' >= e in this window, else in the next one,
// else at the start of the one after.
func (w *SlidingWindow) retryAfter(prev, curr, e, n int64) time.Duration {
	win := w.window
	// This window: prev*(win-e') <= (limit-curr-n)*win.
	if room := w.limit - curr - n; room >= 0 && prev > 0 {
		at := win - int64(uint64(room)*uint64(win)/uint64(prev))
		at = max(at, e)
		if at < win {
			return time.Duration(at - e)
		}
	}
	// Next window: prev' = curr, curr' = 0: curr*(win-e'') <= (limit-n)*win.
	at := int64(0)
	if curr > 0 {
		at = max(0, win-int64(uint64(w.limit-n)*uint64(win)/uint64(curr)))
	}
	if at < win {
		return time.Duration(win - e + at)
	}
	return time.Duration(2*win - e)
}

// Refund implements Algorithm: the refunded units leave the count of the
// window they were charged to, which at now is the current window, the
// previous one, or gone (then nothing is left to give back). Exact whatever
// else was admitted meanwhile.
func (w *SlidingWindow) Refund(cur, before, after State, now int64) State {
	now = max(now, cur[0], after[0])
	start, ap, ac := w.Counts(after, now)
	_, bp, bc := w.Counts(before, now)
	rp, rc := max(0, ap-bp), max(0, ac-bc)
	if rp == 0 && rc == 0 {
		return cur
	}
	_, cp, cc := w.Counts(cur, now)
	return State{start, max(0, cp-rp)<<32 | max(0, cc-rc)}
}

// Idle implements Algorithm: a key is fresh once both of its windows have
// slid out.
func (w *SlidingWindow) Idle(s State, now int64) bool {
	return s[1] == 0 || now >= s[0]+2*w.window
}
