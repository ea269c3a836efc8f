package refmodel

import (
	"net/netip"
	"testing"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
)

// The program's parser is checked against this one by the differential
// test in internal/loader; these cases pin what that test cannot reach.
func TestParseShortFrames(t *testing.T) {
	full := packet.UDP4("198.18.0.1", 123, 53, 0)
	for n := 0; n < 14; n++ {
		if _, r := Parse(full[:n]); r != maps.ReasonBadEth {
			t.Errorf("%d-byte frame: reason %s, want bad_ethernet", n, maps.ReasonName(r))
		}
	}
}

func TestParseFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    packet.Frame
		want Packet
	}{
		{"udp4", packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoUDP, SrcPort: 123, DstPort: 53},
			Packet{Addr: netip.MustParseAddr("::ffff:198.18.0.1").As16(), SrcPort: 123, DstPort: 53, Proto: 17, HasL4: true}},
		{"icmp6 in qinq", packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoICMPv6, DstPort: 128, VLANs: []uint16{1, 2}},
			Packet{Addr: netip.MustParseAddr("fd00::1").As16(), DstPort: 128, Proto: 58, HasL4: true}},
		{"v4 non-first fragment", packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoUDP, SrcPort: 123, FragOffset: 1},
			Packet{Addr: netip.MustParseAddr("::ffff:198.18.0.1").As16(), Proto: 17}},
		{"v6 chain of 7", packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoUDP, SrcPort: 123, IPv6Ext: []uint8{0, 60, 60, 60, 60, 60, 43}},
			Packet{Addr: netip.MustParseAddr("fd00::1").As16(), Proto: 43}},
	} {
		b := tc.f.Build()
		got, r := Parse(b)
		tc.want.Len = uint32(len(b))
		if r != maps.ReasonOK || got != tc.want {
			t.Errorf("%s: got %+v (%s), want %+v", tc.name, got, maps.ReasonName(r), tc.want)
		}
	}
}
