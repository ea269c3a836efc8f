package l7

import "math/bits"

// divisor divides by a constant without a hardware divide: a 64-bit
// division costs ~13 ns on the machines we measure, a multiply-high and a
// shift about 1. Every algorithm divides by the same interval or window on
// each decision (to report Remaining), so it computes the magic once.
//
// Method (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994, theorem 4.2, with N = 63): for a divisor d with
// 2^(l-1) < d <= 2^l and m = ceil(2^(63+l) / d), floor(x/d) equals
// floor(m*x / 2^(63+l)) for every 0 <= x < 2^63, because
// 2^(63+l) <= m*d <= 2^(63+l) + 2^l. m fits in 64 bits and m*x in 128.
type divisor struct {
	d     int64
	m     uint64
	shift uint // 63 + l
}

// newDivisor returns a divisor for d >= 1.
func newDivisor(d int64) divisor {
	if d < 1 {
		panic("l7: divisor below 1")
	}
	l := uint(bits.Len64(uint64(d - 1))) // ceil(log2 d); 0 for d == 1
	var hi, lo uint64                    // 2^(63+l)
	if l == 0 {
		lo = 1 << 63
	} else {
		hi = 1 << (l - 1)
	}
	q, r := bits.Div64(hi, lo, uint64(d)) // hi < d, so no overflow
	if r != 0 {
		q++
	}
	return divisor{d: d, m: q, shift: 63 + l}
}

// div returns x / d (truncated toward zero, as Go's / does).
func (v divisor) div(x int64) int64 {
	if x < 0 {
		return x / v.d // never on the hot paths: remaining amounts are >= 0
	}
	hi, lo := bits.Mul64(uint64(x), v.m)
	if v.shift >= 64 {
		return int64(hi >> (v.shift - 64))
	}
	return int64(hi<<(64-v.shift) | lo>>v.shift)
}

// ceil returns ceil(x/d) for x >= 0 (0 for x <= 0), like ceilDiv.
func (v divisor) ceil(x int64) int64 {
	if x <= 0 {
		return 0
	}
	return v.div(x-1) + 1
}
