package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/edgeguard/edgeguard/internal/asn"
)

// BenchmarkCompile compiles the example policy plus 20 ASN rules against a
// synthetic table shaped like iptoasn's: 400k IPv4 and 100k IPv6 prefixes.
func BenchmarkCompile(b *testing.B) {
	var data []asn.Entry
	for i := 0; i < 400_000; i++ {
		a := netip.AddrFrom4([4]byte{byte(1 + i>>16), byte(i >> 8), byte(i), 0})
		data = append(data, asn.Entry{Prefix: netip.PrefixFrom(a, 24), ASN: uint32(1 + i%50_000), Country: [2]byte{'A', byte('A' + i%26)}})
	}
	for i := 0; i < 100_000; i++ {
		var x [16]byte
		x[0], x[1], x[2], x[3], x[4] = 0x20, 0x01, byte(i>>16), byte(i>>8), byte(i)
		data = append(data, asn.Entry{Prefix: netip.PrefixFrom(netip.AddrFrom16(x), 40), ASN: uint32(1 + i%50_000), Country: [2]byte{'B', byte('A' + i%26)}})
	}
	p, err := Load("../../examples/edgeguard.yaml")
	if err != nil {
		b.Fatal(err)
	}
	p.ASNData.Path = "x.tsv"
	for i := 0; i < 20; i++ {
		p.Rules = append(p.Rules, Rule{Name: fmt.Sprintf("as%d", i), Action: ActionLimit, Match: Match{Kind: MatchASN, ASNs: []uint32{uint32(1 + i)}}, Limits: p.Defaults})
	}
	b.ReportAllocs()
	b.ResetTimer()
	var c *Compiled
	for b.Loop() {
		if c, err = Compile(p, data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(c.Prefixes)), "entries")
}
