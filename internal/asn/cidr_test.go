package asn

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func mustPrefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestAppendRangePrefixesEdgeCases(t *testing.T) {
	tests := []struct {
		start, end string
		want       []string
	}{
		{"0.0.0.0", "255.255.255.255", []string{"0.0.0.0/0"}},
		{"::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", []string{"::/0"}},
		{"0.0.0.0", "0.0.0.0", []string{"0.0.0.0/32"}},
		{"1.2.3.4", "1.2.3.4", []string{"1.2.3.4/32"}},
		{"255.255.255.255", "255.255.255.255", []string{"255.255.255.255/32"}},
		{"::", "::", []string{"::/128"}},
		{"2001:db8::1", "2001:db8::1", []string{"2001:db8::1/128"}},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"}},
		{"1.2.3.0", "1.2.3.255", []string{"1.2.3.0/24"}},
		{"1.2.3.1", "1.2.3.6", []string{"1.2.3.1/32", "1.2.3.2/31", "1.2.3.4/31", "1.2.3.6/32"}},
		{"128.0.0.0", "255.255.255.255", []string{"128.0.0.0/1"}},
		{"0.0.0.0", "127.255.255.255", []string{"0.0.0.0/1"}},
		{"255.255.255.254", "255.255.255.255", []string{"255.255.255.254/31"}},
		{"8000::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", []string{"8000::/1"}},
		{"::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", nil}, // checked by count below
		{"0.0.0.1", "255.255.255.254", nil},
		{"::ffff:1.2.3.0", "::ffff:1.2.3.255", []string{"::ffff:1.2.3.0/120"}},
	}
	for _, tt := range tests {
		got, err := AppendRangePrefixes(nil, netip.MustParseAddr(tt.start), netip.MustParseAddr(tt.end))
		if err != nil {
			t.Fatalf("%s-%s: %v", tt.start, tt.end, err)
		}
		if tt.want != nil {
			if want := mustPrefixes(t, tt.want...); !slices.Equal(got, want) {
				t.Errorf("%s-%s = %v, want %v", tt.start, tt.end, got, want)
			}
			continue
		}
		// Everything but the first and last address: one block per bit length on each side.
		bits := netip.MustParseAddr(tt.start).BitLen()
		if want := 2 * (bits - 1); len(got) != want {
			t.Errorf("%s-%s: %d prefixes, want %d: %v", tt.start, tt.end, len(got), want, got)
		}
		checkExactCover(t, netip.MustParseAddr(tt.start), netip.MustParseAddr(tt.end), got)
	}
}

func TestAppendRangePrefixesErrors(t *testing.T) {
	tests := []struct {
		start, end netip.Addr
		want       string
	}{
		{netip.MustParseAddr("1.2.3.9"), netip.MustParseAddr("1.2.3.0"), "range end 1.2.3.0 is before start 1.2.3.9"},
		{netip.MustParseAddr("1.2.3.9"), netip.MustParseAddr("::1"), "range 1.2.3.9-::1: start and end are of different address families"},
		{netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("fe80::2"), "range fe80::1%eth0-fe80::2: addresses must not carry a zone"},
		{netip.Addr{}, netip.MustParseAddr("1.2.3.4"), "range invalid IP-1.2.3.4: invalid address"},
	}
	for _, tt := range tests {
		dst := mustPrefixes(t, "9.9.9.9/32")
		got, err := AppendRangePrefixes(dst, tt.start, tt.end)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%v-%v: err %v, want %q", tt.start, tt.end, err, tt.want)
		}
		if len(got) != 1 {
			t.Errorf("%v-%v: dst changed on error: %v", tt.start, tt.end, got)
		}
	}
}

// lastAddr is the highest address in p, computed bytewise (independent of u128).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// bruteForcePrefixes computes, address by address, the largest aligned block
// around each address that stays inside [start, end]. The set of these blocks
// is the unique minimal CIDR cover of the range.
func bruteForcePrefixes(start, end netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for a := start; ; a = a.Next() {
		for l := 0; l <= a.BitLen(); l++ {
			p, _ := a.Prefix(l)
			if p.Addr().Compare(start) >= 0 && lastAddr(p).Compare(end) <= 0 {
				if len(out) == 0 || out[len(out)-1] != p {
					out = append(out, p)
				}
				break
			}
		}
		if a == end {
			return out
		}
	}
}

// checkExactCover checks that ps are aligned, ascending, contiguous, start at
// start, end at end, and that no two neighbours are mergeable siblings.
func checkExactCover(t *testing.T, start, end netip.Addr, ps []netip.Prefix) {
	t.Helper()
	if len(ps) == 0 {
		t.Fatalf("%v-%v: no prefixes", start, end)
	}
	next := start
	for i, p := range ps {
		if p != p.Masked() {
			t.Fatalf("%v-%v: prefix %v has host bits", start, end, p)
		}
		if p.Addr() != next {
			t.Fatalf("%v-%v: prefix %d is %v, want it to start at %v", start, end, i, p, next)
		}
		if i > 0 && ps[i-1].Bits() == p.Bits() && p.Bits() > 0 {
			parent, _ := p.Addr().Prefix(p.Bits() - 1)
			if parent.Addr() == ps[i-1].Addr() {
				t.Fatalf("%v-%v: %v and %v could merge into %v", start, end, ps[i-1], p, parent)
			}
		}
		next = lastAddr(p).Next()
	}
	if got := lastAddr(ps[len(ps)-1]); got != end {
		t.Fatalf("%v-%v: cover ends at %v", start, end, got)
	}
}

func randomAddr(r *rand.Rand, is6 bool) netip.Addr {
	if !is6 {
		v := r.Uint32()
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	var b [16]byte
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return netip.AddrFrom16(b)
}

// addN adds n to a, saturating at the top of the address space.
func addN(a netip.Addr, n int) netip.Addr {
	for range n {
		nx := a.Next()
		if !nx.IsValid() {
			return a
		}
		a = nx
	}
	return a
}

func TestAppendRangePrefixesBruteForce(t *testing.T) {
	seed := uint64(20261130)
	r := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)
	top4 := netip.MustParseAddr("255.255.255.255")
	top6 := netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
	for i := range 600 {
		is6 := i%2 == 1
		var start netip.Addr
		switch i % 6 {
		case 0, 1: // anywhere, aligned down a bit so larger blocks occur
			a := randomAddr(r, is6)
			p, _ := a.Prefix(a.BitLen() - r.IntN(9))
			start = addN(p.Addr(), r.IntN(3))
		case 2, 3: // near the bottom of the space
			start = addN(netip.IPv4Unspecified(), r.IntN(64))
			if is6 {
				start = addN(netip.IPv6Unspecified(), r.IntN(64))
			}
		default: // near the top, so the range may end at the last address
			top := top4
			if is6 {
				top = top6
			}
			p, _ := top.Prefix(top.BitLen() - 11)
			start = addN(p.Addr(), r.IntN(2048))
		}
		end := addN(start, r.IntN(2048))
		got, err := AppendRangePrefixes(nil, start, end)
		if err != nil {
			t.Fatalf("%v-%v: %v", start, end, err)
		}
		want := bruteForcePrefixes(start, end)
		if !slices.Equal(got, want) {
			t.Fatalf("%v-%v:\n got %v\nwant %v", start, end, got, want)
		}
	}
}

func TestAppendRangePrefixesLargeRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 2000 {
		is6 := i%2 == 1
		a, b := randomAddr(r, is6), randomAddr(r, is6)
		if b.Less(a) {
			a, b = b, a
		}
		got, err := AppendRangePrefixes(nil, a, b)
		if err != nil {
			t.Fatal(err)
		}
		if max := 2 * a.BitLen(); len(got) > max {
			t.Fatalf("%v-%v: %d prefixes, more than %d", a, b, len(got), max)
		}
		checkExactCover(t, a, b, got)
	}
}
