package maps

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// lookup walks the table as the data plane's v4_direct_lookup does.
func (t *v4Table) lookup(addr uint32) loader.LimiterEgV4Entry {
	e := t.l1[addr>>16]
	for shift := 12; shift >= 0 && e.RuleSlot == v4Child; shift -= 4 {
		e = t.chunks[e.Asn][addr>>shift&15]
	}
	return e
}

// trieAnswer is the longest-prefix match over the trie keys of facts (the
// last fact of a key wins), as the kernel trie answers an IPv4 source.
func trieAnswer(facts []slotFact, addr uint32) loader.LimiterEgV4Entry {
	src := netip.AddrFrom4([4]byte{byte(addr >> 24), byte(addr >> 16), byte(addr >> 8), byte(addr)})
	src16 := netip.AddrFrom16(Addr16(src))
	best, bestBits := loader.LimiterEgV4Entry{}, -1
	for _, f := range facts {
		k := LPMKey(f.Prefix)
		p := netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen))
		if p.Contains(src16) && int(k.Prefixlen) >= bestBits {
			best, bestBits = loader.LimiterEgV4Entry{RuleSlot: f.Slot, Asn: f.ASN}, int(k.Prefixlen)
		}
	}
	return best
}

func randFacts(r *rand.Rand) []slotFact {
	var facts []slotFact
	base := r.Uint32()
	for range 1 + r.IntN(60) {
		bits := r.IntN(33)
		// Mostly near one address, so prefixes nest.
		a := base ^ r.Uint32()>>r.IntN(33)
		p, _ := netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}).Prefix(bits)
		f := slotFact{Prefix: p, Slot: uint32(r.IntN(5)), ASN: uint32(r.IntN(3))}
		if r.IntN(8) == 0 {
			f.Slot = noSlot
		}
		facts = append(facts, f)
		if r.IntN(10) == 0 { // the same key again, or as IPv4-mapped IPv6
			g := f
			g.ASN++
			if r.IntN(2) == 0 {
				g.Prefix = netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96)
			}
			facts = append(facts, g)
		}
	}
	for _, s := range []string{"::/0", "::/80", "::/81", "2001:db8::/32", "::ffff:0:0/96"} {
		if r.IntN(3) == 0 {
			facts = append(facts, slotFact{Prefix: netip.MustParsePrefix(s), Slot: uint32(r.IntN(5)), ASN: 7})
		}
	}
	return facts
}

// TestV4TableMatchesLongestPrefix checks the compiled table against a
// plain longest-prefix match at every prefix boundary and random points.
func TestV4TableMatchesLongestPrefix(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 42))
		facts := randFacts(r)
		bg, v4 := v4Facts(facts)
		tbl, ok := buildV4Table(bg, v4, 1<<20)
		if !ok {
			t.Fatalf("seed %d: over a budget of 2^20 chunks", seed)
		}
		var addrs []uint32
		for _, f := range v4 {
			first := f.addr &^ uint32(uint64(1)<<(32-f.bits)-1)
			last := first | uint32(uint64(1)<<(32-f.bits)-1)
			addrs = append(addrs, first, last, first-1, last+1)
		}
		for range 200 {
			addrs = append(addrs, r.Uint32())
		}
		for _, a := range addrs {
			if got, want := tbl.lookup(a), trieAnswer(facts, a); got != want {
				t.Fatalf("seed %d, address %#08x: table %+v, trie %+v\nfacts %v", seed, a, got, want, facts)
			}
		}
		// The budget is a hard limit: one chunk less than needed fails.
		if n := len(tbl.chunks); n > 0 {
			if _, ok := buildV4Table(bg, v4, n); !ok {
				t.Fatalf("seed %d: %d chunks needed, a budget of %d refused", seed, n, n)
			}
			if _, ok := buildV4Table(bg, v4, n-1); ok {
				t.Fatalf("seed %d: %d chunks needed, a budget of %d accepted", seed, n, n-1)
			}
		}
	}
}

func TestV4TableChunkCount(t *testing.T) {
	p := func(s string) v4Fact {
		pf := netip.MustParsePrefix(s)
		a := pf.Addr().As4()
		return v4Fact{addr: uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]), bits: pf.Bits()}
	}
	for _, c := range []struct {
		facts []v4Fact
		want  int
	}{
		{nil, 0},
		{[]v4Fact{p("10.0.0.0/8"), p("10.1.0.0/16")}, 0},
		{[]v4Fact{p("10.1.0.0/17")}, 1},
		{[]v4Fact{p("10.1.0.0/20"), p("10.1.16.0/20")}, 1},
		{[]v4Fact{p("10.1.2.0/24")}, 2},
		{[]v4Fact{p("10.1.2.3/32")}, 4},
		{[]v4Fact{p("10.1.2.3/32"), p("10.1.2.4/32"), p("10.1.2.0/28")}, 4},
	} {
		tbl, ok := buildV4Table(loader.LimiterEgV4Entry{}, c.facts, 100)
		if !ok || len(tbl.chunks) != c.want {
			t.Errorf("%v: %d chunks (ok %v), want %d", c.facts, len(tbl.chunks), ok, c.want)
		}
	}
}
