package shield

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// BenchmarkObserve is the daemon's learning cost per sample: one Observe
// (keys, tracking, attribution, fingerprint summaries when hot) plus its
// share of the per-interval Tick, at 10,000 samples per interval. The peer
// is counting the same keys in a Go map (what top-talker counts cost), so
// the ratio stays meaningful on a loaded machine. Samples per second one
// core sustains = 1e9 / ns/op; docs/shield.md says what the data plane's
// sample cap is against it.
func BenchmarkObserve(b *testing.B) {
	const perTick = 10000
	mk := func(flood bool) []Sample {
		rng := rand.New(rand.NewPCG(5, 6))
		out := make([]Sample, 1<<16)
		for i := range out {
			s := Sample{Src: netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(64)), byte(rng.IntN(256))}), ASN: 64500 + uint32(rng.IntN(8)),
				Proto: 17, SPort: uint16(rng.IntN(65536)), DPort: 443, Len: uint16(60 + rng.IntN(1400)), TTL: 64, Weight: 16}
			if flood && i%2 == 0 {
				s.Src = netip.AddrFrom4([4]byte{byte(rng.IntN(224)), byte(rng.IntN(256)), byte(rng.IntN(256)), 1})
				s.DPort, s.Len, s.Weight = 9999, 512, 1024
			}
			out[i] = s
		}
		return out
	}
	run := func(b *testing.B, samples []Sample, warm bool) {
		c := policy.DefaultShield()
		c.Mode, c.LearnFor, c.HalfLife = ModeEnforce, 10*time.Second, time.Minute
		e := New(c, Options{})
		now := t0
		e.Tick(now)
		if warm { // learn the normal mix, so the flood is judged
			normal := mk(false)
			for i := range 30 * perTick {
				e.Observe(normal[i%len(normal)])
				if i%perTick == perTick-1 {
					now = now.Add(time.Second)
					e.Tick(now)
				}
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			e.Observe(samples[i%len(samples)])
			if i%perTick == perTick-1 {
				now = now.Add(time.Second)
				e.Tick(now)
			}
		}
	}
	b.Run("normal", func(b *testing.B) { run(b, mk(false), false) })
	b.Run("flood", func(b *testing.B) { run(b, mk(true), true) })
	b.Run("peer-map-count", func(b *testing.B) {
		samples := mk(false)
		counts := map[Key]float64{}
		var ks []Key
		for i := 0; i < b.N; i++ {
			ks = keys(ks[:0], samples[i%len(samples)], RuleShape{PrefixLen4: 24})
			for _, k := range ks {
				counts[k]++
			}
		}
	})
}
