package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func entries(spec string) []trieEntry[int] {
	var out []trieEntry[int]
	for _, f := range strings.Fields(spec) {
		p, v, _ := strings.Cut(f, "=")
		var n int
		fmt.Sscan(v, &n)
		out = append(out, trieEntry[int]{prefix: netip.MustParsePrefix(p), value: n})
	}
	return out
}

func entriesString(es []trieEntry[int]) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, fmt.Sprintf("%s=%d", e.prefix, e.value))
	}
	return strings.Join(parts, " ")
}

func TestCompact(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"equal siblings merge", "10.0.0.0/25=1 10.0.0.128/25=1", "10.0.0.0/24=1"},
		{"merges cascade", "10.0.0.0/25=1 10.0.0.128/25=1 10.0.1.0/24=1", "10.0.0.0/23=1"},
		{"a merged parent equal to its own parent goes", "10.0.0.0/16=1 10.0.0.0/25=1 10.0.0.128/25=1", "10.0.0.0/16=1"},
		{"different siblings stay", "10.0.0.0/25=1 10.0.0.128/25=2", "10.0.0.0/25=1 10.0.0.128/25=2"},
		{"a parent covered by both halves never matches", "10.0.0.0/24=3 10.0.0.0/25=1 10.0.0.128/25=2", "10.0.0.0/25=1 10.0.0.128/25=2"},
		{"a shadowed parent is replaced by equal halves", "10.0.0.0/24=3 10.0.0.0/25=1 10.0.0.128/25=1", "10.0.0.0/24=1"},
		{"zero values at the top go", "10.0.0.0/8=0 11.0.0.0/8=2", "11.0.0.0/8=2"},
		{"IPv4 halves merge into 0.0.0.0/0 but not into IPv6", "0.0.0.0/1=1 128.0.0.0/1=1 ::fffe:0:0/96=1", "0.0.0.0/0=1 ::fffe:0:0/96=1"},
		{"the IPv4 range shields IPv4 from IPv6 above it", "::/0=1 0.0.0.0/0=0", "0.0.0.0/0=0 ::/0=1"},
		{"IPv6 siblings", "2001:db8::/33=4 2001:db8:8000::/33=4", "2001:db8::/32=4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := entriesString(compact(entries(tc.in))); got != tc.want {
				t.Errorf("compact(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// TestCompactKeepsEveryLookup checks, exhaustively over small address
// spaces, that compact changes no lookup and never adds entries.
func TestCompactKeepsEveryLookup(t *testing.T) {
	for seed := uint64(0); seed < 500; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		seen := map[netip.Prefix]bool{}
		var in []trieEntry[int]
		for i := 0; i < 1+r.IntN(20); i++ {
			var p netip.Prefix
			switch r.IntN(8) {
			case 0:
				p = netip.PrefixFrom(netip.IPv6Unspecified(), r.IntN(2))
			case 1:
				p = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(r.IntN(2) << 7), 0, 0, 0}), r.IntN(2))
			default:
				p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(256))}), 24+r.IntN(9))
			}
			p = p.Masked()
			if seen[p] {
				continue
			}
			seen[p] = true
			in = append(in, trieEntry[int]{prefix: p, value: r.IntN(3)})
		}
		out := compact(in)
		if len(out) > len(in) {
			t.Fatalf("seed %d: %d entries became %d", seed, len(in), len(out))
		}
		if !slices.IsSortedFunc(out, func(a, b trieEntry[int]) int { return compareOutput(a.prefix, b.prefix) }) {
			t.Fatalf("seed %d: output not sorted: %s", seed, entriesString(out))
		}
		addrs := []netip.Addr{netip.MustParseAddr("::1"), netip.MustParseAddr("8000::1"), netip.MustParseAddr("200.1.1.1"), netip.MustParseAddr("1.1.1.1")}
		for i := 0; i < 256; i++ {
			addrs = append(addrs, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
		}
		for _, a := range addrs {
			want, _ := lpm(in, func(e trieEntry[int]) netip.Prefix { return e.prefix }, a)
			got, _ := lpm(out, func(e trieEntry[int]) netip.Prefix { return e.prefix }, a)
			if got.value != want.value {
				t.Fatalf("seed %d: %s: %d, want %d\nin:  %s\nout: %s", seed, a, got.value, want.value, entriesString(in), entriesString(out))
			}
		}
	}
}
