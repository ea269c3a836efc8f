package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/asn"
)

// The data plane looks sources up as IPv4-mapped IPv6 in one trie; these
// helpers do the same so the tests check what packets will see.
func lpm[T any](entries []T, prefix func(T) netip.Prefix, a netip.Addr) (T, bool) {
	var best T
	bits, found := -1, false
	ua := netip.AddrFrom16(a.As16())
	for _, e := range entries {
		p := unify(prefix(e))
		if p.Contains(ua) && p.Bits() > bits {
			best, bits, found = e, p.Bits(), true
		}
	}
	return best, found
}

// randPrefix draws prefixes from a small space so they nest and collide.
func randPrefix(r *rand.Rand, six bool) netip.Prefix {
	if six {
		var b [16]byte
		b[0], b[1], b[2] = 0x20, 0x01, byte(r.IntN(4))
		if r.IntN(10) == 0 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), r.IntN(3)) // covers the IPv4-mapped range
		}
		return netip.PrefixFrom(netip.AddrFrom16(b), 14+r.IntN(12)).Masked()
	}
	a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4) << 6), 0})
	if r.IntN(15) == 0 {
		return netip.PrefixFrom(a, 0).Masked()
	}
	return netip.PrefixFrom(a, 6+r.IntN(20)).Masked()
}

func randAddr(r *rand.Rand, six bool) netip.Addr {
	if six {
		var b [16]byte
		b[0], b[1], b[2], b[3] = 0x20, 0x01, byte(r.IntN(4)), byte(r.IntN(256))
		if r.IntN(10) == 0 {
			b[0], b[1] = 0, 0
		}
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
}

// TestCompilePrefixesAgainstDefinition builds random rules and ASN data and
// checks, for many addresses, that a longest-prefix match on the compiled
// entries gives exactly the facts the precedence rules define, and that no
// entry repeats what its parent (or no match) already says.
func TestCompilePrefixesAgainstDefinition(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		var src string
		ruleOf := map[netip.Prefix]string{}
		asnRule := map[uint32]string{}
		countryRule := map[Country]string{}
		src += withASNData + "rules:\n"
		for i := 0; i < 1+r.IntN(8); i++ {
			p := randPrefix(r, r.IntN(2) == 0)
			if _, dup := ruleOf[p]; dup {
				continue
			}
			name := fmt.Sprintf("p%d", i)
			ruleOf[p] = name
			src += fmt.Sprintf("  - {name: %s, match: {prefixes: [%q]}}\n", name, p)
		}
		var data []asn.Entry
		seen := map[netip.Prefix]bool{}
		for i := 0; i < r.IntN(12); i++ {
			p := randPrefix(r, r.IntN(2) == 0)
			if seen[p] {
				continue
			}
			seen[p] = true
			data = append(data, asn.Entry{Prefix: p, ASN: uint32(1 + r.IntN(4)), Country: [2]byte{'A', byte('A' + r.IntN(3))}})
		}
		for a := uint32(1); a <= 4; a++ {
			if r.IntN(2) == 0 {
				asnRule[a] = fmt.Sprintf("as%d", a)
				src += fmt.Sprintf("  - {name: as%d, match: {asns: [%d]}}\n", a, a)
			}
		}
		for c := byte('A'); c < 'D'; c++ {
			if r.IntN(2) == 0 {
				country := Country{'A', c}
				countryRule[country] = "c" + strings.ToLower(country.String())
				src += fmt.Sprintf("  - {name: %s, match: {countries: [%s]}}\n", countryRule[country], country)
			}
		}
		c, err := Compile(mustParse(t, src), data)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for i := 0; i < 300; i++ {
			addr := randAddr(r, r.IntN(2) == 0)
			// Definition: same family only, most specific rule prefix >
			// ASN rule > country rule > default; ASN from the most specific
			// covering ASN range.
			var want PrefixFact
			ruleBits, asnBits := -1, -1
			wantRule := DefaultRuleName
			for p, name := range ruleOf {
				if p.Contains(addr) && p.Bits() > ruleBits {
					ruleBits, wantRule = p.Bits(), name
				}
			}
			for _, e := range data {
				if e.Prefix.Contains(addr) && e.Prefix.Bits() > asnBits {
					asnBits, want.ASN, want.Country = e.Prefix.Bits(), e.ASN, Country(e.Country)
				}
			}
			if ruleBits < 0 && asnBits >= 0 {
				if n, ok := asnRule[want.ASN]; ok {
					wantRule = n
				} else if n, ok := countryRule[want.Country]; ok {
					wantRule = n
				}
			}
			want.RuleID = RuleID(wantRule)
			got, _ := lpm(c.Prefixes, func(f PrefixFact) netip.Prefix { return f.Prefix }, addr)
			got.Prefix = netip.Prefix{}
			if got != want {
				t.Fatalf("seed %d: %s gets %+v, want %+v (rule %s)\npolicy:\n%s\nentries:\n%s", seed, addr, got, want, wantRule, src, factsString(c.Prefixes, ruleNames(c)))
			}
		}
		if !slices.IsSortedFunc(c.Prefixes, func(a, b PrefixFact) int { return compareOutput(a.Prefix, b.Prefix) }) {
			t.Fatalf("seed %d: entries are not sorted IPv4 first, then by address and length", seed)
		}
		// Minimality: no entry equals what the lookup would give without it.
		for i, e := range c.Prefixes {
			rest := append(append([]PrefixFact{}, c.Prefixes[:i]...), c.Prefixes[i+1:]...)
			parent, _ := lpm(rest, func(f PrefixFact) netip.Prefix { return f.Prefix }, e.Prefix.Addr())
			if pp := unify(parent.Prefix); parent.Prefix.IsValid() && pp.Bits() > unify(e.Prefix).Bits() {
				parent = PrefixFact{} // a more specific entry at the same address is not a parent
				for _, o := range rest {
					if uo := unify(o.Prefix); uo.Bits() < unify(e.Prefix).Bits() && uo.Contains(unify(e.Prefix).Addr()) &&
						(!parent.Prefix.IsValid() || uo.Bits() > unify(parent.Prefix).Bits()) {
						parent = o
					}
				}
			}
			parent.Prefix, e.Prefix = netip.Prefix{}, netip.Prefix{}
			if parent == e {
				t.Fatalf("seed %d: entry %s repeats its parent's facts\n%s", seed, c.Prefixes[i].Prefix, factsString(c.Prefixes, ruleNames(c)))
			}
		}
	}
}

// TestCompileListsAgainstDefinition checks the folded lists against the
// definition (deny wins over allow while active; an expired listing matches
// nothing) at several instants, using only the most specific entry as the
// data plane does.
func TestCompileListsAgainstDefinition(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 11))
		var deny, allow []ListEntry
		for i := 0; i < r.IntN(10); i++ {
			e := ListEntry{Prefix: randPrefix(r, r.IntN(2) == 0)}
			if r.IntN(2) == 0 {
				e.Expires = base.Add(time.Duration(1+r.IntN(4)) * time.Hour)
			}
			if r.IntN(2) == 0 {
				deny = append(deny, e)
			} else {
				allow = append(allow, e)
			}
		}
		recs := compileLists(deny, allow)
		active := func(l Listing, now time.Time) bool { return l.Listed && (l.Until.IsZero() || now.Before(l.Until)) }
		for i := 0; i < 300; i++ {
			addr := randAddr(r, r.IntN(2) == 0)
			now := base.Add(time.Duration(r.IntN(6)) * time.Hour)
			want := "none"
			covers := func(es []ListEntry) bool {
				for _, e := range es {
					if e.Prefix.Contains(addr) && (e.Expires.IsZero() || now.Before(e.Expires)) {
						return true
					}
				}
				return false
			}
			if covers(deny) {
				want = "deny"
			} else if covers(allow) {
				want = "allow"
			}
			got := "none"
			if rec, ok := lpm(recs, func(l ListRecord) netip.Prefix { return l.Prefix }, addr); ok {
				if active(rec.Deny, now) {
					got = "deny"
				} else if active(rec.Allow, now) {
					got = "allow"
				}
			}
			if got != want {
				t.Fatalf("seed %d: %s at %s: got %s, want %s\ndeny %+v\nallow %+v\nrecords %+v", seed, addr, now.Format(time.TimeOnly), got, want, deny, allow, recs)
			}
		}
	}
}
