package asn

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func cc(s string) [2]byte { return [2]byte{s[0], s[1]} }

func TestTableLookup(t *testing.T) {
	tbl, err := NewTable([]Entry{
		{Prefix: netip.MustParsePrefix("2001:db8::/32"), ASN: 64500, Country: cc("NL")},
		{Prefix: netip.MustParsePrefix("1.0.0.0/24"), ASN: 13335, Country: cc("US")},
		{Prefix: netip.MustParsePrefix("1.0.1.0/31"), ASN: 64501},
		{Prefix: netip.MustParsePrefix("255.255.255.255/32"), ASN: 64502, Country: cc("DE")},
		{Prefix: netip.MustParsePrefix("0.0.0.0/32"), ASN: 64503},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		addr string
		asn  uint32 // 0: not found
	}{
		{"0.0.0.0", 64503},
		{"0.0.0.1", 0},
		{"0.255.255.255", 0},
		{"1.0.0.0", 13335},
		{"1.0.0.255", 13335},
		{"::ffff:1.0.0.7", 13335}, // v4-mapped looks up as IPv4
		{"1.0.1.0", 64501},
		{"1.0.1.1", 64501},
		{"1.0.1.2", 0},
		{"255.255.255.254", 0},
		{"255.255.255.255", 64502},
		{"::", 0},
		{"::1.0.0.1", 0}, // IPv4-compatible is IPv6, not IPv4
		{"2001:db8::", 64500},
		{"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 64500},
		{"2001:db8::1%eth0", 64500},
		{"2001:db9::", 0},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0},
	}
	for _, tt := range tests {
		e, ok := tbl.Lookup(netip.MustParseAddr(tt.addr))
		if ok != (tt.asn != 0) || e.ASN != tt.asn {
			t.Errorf("Lookup(%s) = %+v, %v; want ASN %d", tt.addr, e, ok, tt.asn)
		}
	}
	if _, ok := tbl.Lookup(netip.Addr{}); ok {
		t.Error("Lookup(invalid) found an entry")
	}
	if tbl.Len() != 5 || tbl.Stats().IPv4Entries != 4 || tbl.Stats().IPv6Entries != 1 {
		t.Errorf("Len %d, stats %+v", tbl.Len(), tbl.Stats())
	}
	var prev netip.Addr
	for e := range tbl.All() {
		if prev.IsValid() && !prev.Less(e.Prefix.Addr()) {
			t.Errorf("All not in order: %v after %v", e.Prefix, prev)
		}
		prev = e.Prefix.Addr()
	}
	var empty *Table
	if _, ok := empty.Lookup(netip.MustParseAddr("1.1.1.1")); ok || empty.Len() != 0 {
		t.Error("nil table should be empty")
	}
}

func TestNewTableRejects(t *testing.T) {
	tests := []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"overlap", []Entry{{Prefix: netip.MustParsePrefix("1.0.0.0/24")}, {Prefix: netip.MustParsePrefix("1.0.0.128/25")}},
			"new asn table: prefix 1.0.0.0/24 overlaps 1.0.0.128/25"},
		{"host bits", []Entry{{Prefix: netip.MustParsePrefix("1.0.0.1/24")}}, "new asn table: prefix 1.0.0.1/24 is not a valid masked prefix"},
		{"invalid", []Entry{{}}, "new asn table: prefix invalid Prefix is not a valid masked prefix"},
		{"mapped", []Entry{{Prefix: netip.MustParsePrefix("::ffff:1.2.3.0/120")}}, "new asn table: prefix ::ffff:1.2.3.0/120 is IPv4-mapped; use the IPv4 form"},
	}
	for _, tt := range tests {
		_, err := NewTable(tt.entries)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestTableLookupRandom compares Lookup with a linear scan over random
// disjoint prefixes, for random addresses and for every prefix edge.
func TestTableLookupRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var entries []Entry
	for len(entries) < 3000 {
		is6 := r.IntN(3) == 0
		a := randomAddr(r, is6)
		bits := 8 + r.IntN(25)
		if is6 {
			bits = 16 + r.IntN(113)
		}
		p, _ := a.Prefix(bits)
		overlaps := false
		for _, e := range entries {
			if e.Prefix.Overlaps(p) {
				overlaps = true
				break
			}
		}
		if !overlaps {
			entries = append(entries, Entry{Prefix: p, ASN: uint32(len(entries) + 1)})
		}
	}
	tbl, err := NewTable(entries)
	if err != nil {
		t.Fatal(err)
	}
	linear := func(a netip.Addr) uint32 {
		for _, e := range entries {
			if e.Prefix.Contains(a) {
				return e.ASN
			}
		}
		return 0
	}
	var probes []netip.Addr
	for _, e := range entries {
		first, last := e.Prefix.Addr(), lastAddr(e.Prefix)
		probes = append(probes, first, last, first.Prev(), last.Next())
	}
	for range 20000 {
		probes = append(probes, randomAddr(r, r.IntN(2) == 0))
	}
	for _, a := range probes {
		if !a.IsValid() {
			continue
		}
		e, ok := tbl.Lookup(a)
		if want := linear(a); e.ASN != want || ok != (want != 0) {
			t.Fatalf("Lookup(%v) = %d, %v; linear scan says %d", a, e.ASN, ok, want)
		}
	}
}
