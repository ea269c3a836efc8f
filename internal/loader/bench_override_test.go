package loader_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// ratioTo is an extra metric: this case's time per packet over base's,
// measured in interleaved chunks in the same run (this machine's speed
// drifts), named x-<base>.
func ratioTo(c *benchCase, baseName string, base *benchCase) extraMetric {
	return extraMetric{"x-" + baseName, func(b *testing.B) float64 {
		var mine, theirs time.Duration
		for range 20 {
			for i := range c.frames {
				mine += steadyRun(b, c.prog, c.frames[i], 1<<15)
				theirs += steadyRun(b, base.prog, base.frames[i%len(base.frames)], 1<<15)
			}
		}
		return float64(mine) / float64(theirs)
	}}
}

// asnBenchGen is "pass" plus an ASN aggregate with a budget that never runs
// out: 198.18.0.0/15 is AS64500.
func asnBenchGen() policy.Compiled {
	r := generousRule(0)
	r.PerASN = policy.Bucket{Packets: generous}
	g := enforce()
	g.Rules = []policy.CompiledRule{r}
	g.Prefixes = []policy.PrefixFact{{Prefix: netip.MustParsePrefix("198.18.0.0/15"), ASN: 64500}}
	return g
}

// generousRate never runs out at a few tens of Mpps (an override's budget).
var generousRate = maps.Rate{Count: generous.Rate.Count, Per: generous.Rate.Per, Burst: generous.Burst}

// passASNCase is the baseline of the override cases: no override exists,
// so the rule's gate word is zero and no override is looked up.
func passASNCase(b *testing.B) *benchCase {
	bd := loadBench(b, smallSizes)
	bd.apply(asnBenchGen())
	c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
	c.extras = []extraMetric{ratioTo(c, "pass", cached(b, "pass", passCase))}
	return c
}

// overrideCase is pass_asn with an override on the packets' ASN aggregate:
// a replacement budget (one hash lookup in the look and one in the
// charge), and with newBudget also a new-source bucket, which looks the
// source's standing up and charges a second CAS'd word.
func overrideCase(newBudget bool) func(b *testing.B) *benchCase {
	return func(b *testing.B) *benchCase {
		bd := loadBench(b, smallSizes)
		bd.apply(asnBenchGen())
		o := maps.Override{Aggregate: maps.Aggregate{Kind: maps.AggKindASN, ASN: 64500}, Budget: generousRate,
			Expires: time.Now().Add(24 * time.Hour), Origin: maps.OriginShield}
		if newBudget {
			o.NewBudget = generousRate
		}
		if err := bd.m.SetOverride(o); err != nil {
			b.Fatal(err)
		}
		c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
		c.extras = []extraMetric{
			ratioTo(c, "pass", cached(b, "pass", passCase)),
			ratioTo(c, "pass_asn", cached(b, "pass_asn", passASNCase)),
		}
		return c
	}
}

// watchCase is pass_asn with the rule's ASN aggregates watched: one
// per-CPU hash lookup and two adds per packet.
func watchCase(b *testing.B) *benchCase {
	bd := loadBench(b, smallSizes)
	bd.apply(asnBenchGen())
	if err := bd.m.WatchAggregates(0, maps.AggKindASN, maps.OriginShield); err != nil {
		b.Fatal(err)
	}
	c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
	c.extras = []extraMetric{ratioTo(c, "pass_asn", cached(b, "pass_asn", passASNCase))}
	return c
}

// fingerprintCase is "pass" with n fingerprints installed over masks
// distinct masks, none of which matches the frame (the common case: a
// packet of a user checked against the shield's rules): one hash lookup
// per mask, a miss.
func fingerprintCase(n, masks int) func(b *testing.B) *benchCase {
	return func(b *testing.B) *benchCase {
		bd := loadBench(b, smallSizes)
		bd.apply(passGen())
		shapes := []maps.FieldMask{
			maps.FieldProto | maps.FieldDPort | maps.FieldLen, maps.FieldProto | maps.FieldDPort, maps.FieldDPort | maps.FieldTTL,
			maps.FieldLen | maps.FieldTTL, maps.FieldProto | maps.FieldTCPFlags, maps.FieldSPort, maps.FieldSrc | maps.FieldDPort,
			maps.FieldSrc,
		}
		exp := time.Now().Add(24 * time.Hour)
		for i := 0; i < n; i++ {
			f := maps.Fingerprint{ID: uint32(i + 1), Mask: shapes[i%masks], Proto: 17, DPort: uint16(10000 + i), SPort: uint16(20000 + i),
				Len: uint16(100 + i%1000), TTL: uint8(1 + i%50), TCPFlags: 0x02,
				Src: netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 32), Budget: generousRate, Expires: exp}
			if err := bd.m.SetFingerprint(f); err != nil {
				b.Fatal(err)
			}
		}
		c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
		c.extras = []extraMetric{ratioTo(c, "pass", cached(b, "pass", passCase))}
		return c
	}
}

func passGen() policy.Compiled {
	g := enforce()
	g.Rules = []policy.CompiledRule{generousRule(0)}
	return g
}

// passSampledCase is "pass" with the default 1-in-N sampling (one_in 1024,
// 20,000/s): one random number per packet, a ring buffer write per 1,024.
// No reader drains the ring buffer, so once it fills, chosen packets count
// as lost instead of being written: the cost of a full ring, not an empty one.
func passSampledCase(b *testing.B) *benchCase {
	bd := loadBench(b, smallSizes)
	g := passGen()
	g.Sampling = policy.DefaultSampling()
	bd.apply(g)
	c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
	c.extras = []extraMetric{ratioTo(c, "pass", cached(b, "pass", passCase))}
	return c
}
