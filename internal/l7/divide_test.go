package l7

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestDivisorMatchesDivision(t *testing.T) {
	ds := []int64{1, 2, 3, 5, 7, 10, 1000, 999_999_937, 1_000_000_000, math.MaxInt64, math.MaxInt64 - 1}
	for k := 1; k < 63; k++ {
		p := int64(1) << k
		ds = append(ds, p-1, p, p+1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		ds = append(ds, rng.Int64N(math.MaxInt64)+1, rng.Int64N(1<<20)+1)
	}
	for _, d := range ds {
		v := newDivisor(d)
		xs := []int64{0, 1, d - 1, d, d + 1, 2*d - 1, 2 * d, math.MaxInt64, math.MaxInt64 - 1, 1 << 62, -1, -d, math.MinInt64 + 1}
		for range 200 {
			xs = append(xs, rng.Int64(), rng.Int64N(1<<32), -rng.Int64N(1<<40))
			if d < math.MaxInt64/1000 {
				q := rng.Int64N(math.MaxInt64/d - 1)
				xs = append(xs, q*d, q*d+d-1, q*d+1)
			}
		}
		for _, x := range xs {
			if x < 0 && d == math.MaxInt64 && x == math.MinInt64 {
				continue
			}
			if got, want := v.div(x), x/d; got != want {
				t.Fatalf("%d / %d = %d, want %d", x, d, got, want)
			}
		}
	}
}

func BenchmarkDivisor(b *testing.B) {
	v := newDivisor(1_000_003)
	x := int64(1 << 40)
	var sink int64
	for b.Loop() {
		sink += v.div(x)
		x++
	}
	_ = sink
}

func TestDivisorCeil(t *testing.T) {
	for _, d := range []int64{1, 3, 1000, 1 << 40} {
		v := newDivisor(d)
		for _, x := range []int64{-5, 0, 1, d - 1, d, d + 1, 5*d + 3, math.MaxInt64} {
			if got, want := v.ceil(x), ceilDiv(x, d); got != want {
				t.Fatalf("ceil(%d/%d) = %d, want %d", x, d, got, want)
			}
		}
	}
}
