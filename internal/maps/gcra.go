package maps

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// TickShift and ByteShift are EG_TICK_SHIFT and EG_BYTE_SHIFT of
// bpf/headers/edgeguard_types.h, through bpf2go (enum eg_shifts).
const (
	TickShift = uint64(loader.LimiterEgShiftsEG_SHIFT_TICK)
	ByteShift = uint64(loader.LimiterEgShiftsEG_SHIFT_BYTE)
	// RateShift is the fixed point of standing's rates (usual, current).
	RateShift = uint64(loader.LimiterEgShiftsEG_SHIFT_RATE)
)

// BucketCfg is the data plane's GCRA parameter block.
type BucketCfg = loader.LimiterEgBucketCfg

// mulDivCeil returns ceil(a*b/c) or an error on overflow.
func mulDivCeil(a, b, c uint64) (uint64, error) {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return 0, fmt.Errorf("rate parameters overflow")
	}
	q, r := bits.Div64(hi, lo, c)
	if r != 0 {
		q++
	}
	return q, nil
}

// BucketConfig turns a policy bucket into GCRA parameters. The emission
// interval is rounded up to the next tick, so the data plane never admits
// more than the rate; the shortfall is below one tick (1/16 ns) per event.
func BucketConfig(b policy.Bucket) (BucketCfg, error) {
	var c BucketCfg
	if b.Packets.IsSet() {
		if err := checkLimit("packets", b.Packets); err != nil {
			return c, err
		}
		t, err := mulDivCeil(uint64(b.Packets.Rate.Per), 1<<TickShift, b.Packets.Rate.Count)
		if err != nil {
			return c, err
		}
		tau, err := mulDivCeil(t, b.Packets.Burst, 1)
		if err != nil {
			return c, fmt.Errorf("packet burst too large: %w", err)
		}
		c.PktT, c.PktTau = t, tau
	}
	if b.Bytes.IsSet() {
		if err := checkLimit("bytes", b.Bytes); err != nil {
			return c, err
		}
		t, err := mulDivCeil(uint64(b.Bytes.Rate.Per), 1<<(TickShift+ByteShift), b.Bytes.Rate.Count)
		if err != nil {
			return c, err
		}
		tau, err := mulDivCeil(t, b.Bytes.Burst, 1<<ByteShift)
		if err != nil {
			return c, fmt.Errorf("byte burst too large: %w", err)
		}
		c.ByteT, c.ByteTau = t, tau
	}
	return c, nil
}

func checkLimit(what string, l policy.Limit) error {
	if l.Rate.Per <= 0 {
		return fmt.Errorf("%s rate: period must be positive", what)
	}
	if l.Burst < 1 {
		return fmt.Errorf("%s rate: burst must be at least 1", what)
	}
	if l.Burst > math.MaxUint32*uint64(1024) {
		return fmt.Errorf("%s rate: burst %d too large", what, l.Burst)
	}
	return nil
}

// GCRA is the Go mirror of the data plane's per-dimension GCRA
// (bpf/headers/edgeguard_gcra.h), for tests and the reference model.
type GCRA struct{ TAT uint64 }

// WouldAdmit reports whether an event of cost inc at now (ticks) fits the
// tolerance tau; it charges nothing (the reference model charges with
// max(TAT, now) + inc, as the program does).
func (g GCRA) WouldAdmit(now, inc, tau uint64) bool {
	return max(g.TAT, now)+inc-now <= tau
}

// ByteCost is the tick cost of a packet of len bytes.
func ByteCost(c BucketCfg, length uint32) uint64 {
	return (uint64(length) * c.ByteT) >> ByteShift
}

func bucketLimited(c loader.LimiterEgBucketCfg) bool { return c.PktT != 0 || c.ByteT != 0 }
