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
		if err := bd.m.Overrides.Set(o); err != nil {
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
	if err := bd.m.Overrides.Watch(0, maps.AggKindASN, maps.OriginShield); err != nil {
		b.Fatal(err)
	}
	c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
	c.extras = []extraMetric{ratioTo(c, "pass_asn", cached(b, "pass_asn", passASNCase))}
	return c
}

// fpBenchShapes are the masks of the fingerprint cases, the shield's kind
// (every one names the protocol, UDP, the frame's: the protocol filters
// nothing): three that name the destination port, then five that do not.
var fpBenchShapes = []maps.FieldMask{
	maps.FieldProto | maps.FieldDPort | maps.FieldLen, maps.FieldProto | maps.FieldDPort, maps.FieldProto | maps.FieldDPort | maps.FieldTTL,
	maps.FieldProto | maps.FieldSPort, maps.FieldProto | maps.FieldLen | maps.FieldTTL, maps.FieldProto | maps.FieldSrc,
	maps.FieldProto | maps.FieldSPort | maps.FieldLen, maps.FieldProto | maps.FieldLen,
}

// fpBench says what the fingerprints of a fingerprint case share with the
// frame (UDP 198.18.0.1:40000 to port 53, IP length 50, TTL 64).
type fpBench int

const (
	// fpOtherPort: nothing but the protocol; other ports (10000+i),
	// lengths (100+i%1000), TTLs (1+i%50), source ports (20000+i),
	// sources (203.0.0.0/16).
	fpOtherPort fpBench = iota
	// fpSamePort: as fpOtherPort, on the frame's port 53 (TCP for the
	// proto+dport mask): the prefilter rejects the frame on a second
	// field (length, TTL, protocol).
	fpSamePort
	// fpCollide: half TCP to port 53, half UDP of length 50 and TTL
	// 64, never the frame's whole: the prefilter, which looks at each
	// field alone, lets the frame through to every slot (a false
	// positive), which then costs its hash lookup, a miss.
	fpCollide
)

// fingerprintCase is "pass" with n fingerprints installed over the first
// masks of fpBenchShapes, none of which matches the frame (the common
// case: a user's packet checked against the shield's rules).
func fingerprintCase(n, masks int, share fpBench) func(b *testing.B) *benchCase {
	return func(b *testing.B) *benchCase {
		bd := loadBench(b, smallSizes)
		bd.apply(passGen())
		exp := time.Now().Add(24 * time.Hour)
		for i := 0; i < n; i++ {
			f := maps.Fingerprint{ID: uint32(i + 1), Mask: fpBenchShapes[i%masks], Proto: 17, DPort: uint16(10000 + i), SPort: uint16(20000 + i),
				Len: uint16(100 + i%1000), TTL: uint8(1 + i%50), TCPFlags: 0x02,
				Src: netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 32), Budget: generousRate, Expires: exp}
			switch {
			case share == fpSamePort && fpBenchShapes[i%masks] == maps.FieldProto|maps.FieldDPort:
				f.DPort, f.Proto = 53, 6 // TCP: UDP to 53 would match
			case share == fpSamePort:
				f.DPort = 53
			case share == fpCollide && (i/masks)%2 == 0:
				f.DPort, f.Proto = 53, 6
			case share == fpCollide:
				f.Len, f.TTL = 50, 64
			}
			if err := bd.m.Fingerprints.Set(f); err != nil {
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
