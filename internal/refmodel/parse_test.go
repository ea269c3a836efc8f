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
		got.IPLen, got.TTL, got.TCPFlags = 0, 0, 0 // TestParseFingerprintFields
		if r != maps.ReasonOK || got != tc.want {
			t.Errorf("%s: got %+v (%s), want %+v", tc.name, got, maps.ReasonName(r), tc.want)
		}
	}
}

// Strict lengths: nothing past the datagram's length field is a header.
// (The loader's TestParserDissector checks these, and many more, against
// an independent dissector and the program.)
func TestParseStrictLengths(t *testing.T) {
	setLen := func(b []byte, off int, n uint16) []byte {
		b[off], b[off+1] = byte(n>>8), byte(n)
		return b
	}
	pad := func(b []byte, n int) []byte { return append(b, make([]byte, n)...) }
	udp4 := func() []byte { return packet.UDP4("198.18.0.1", 123, 53, 0) }
	udp6 := func() []byte {
		return packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoUDP, SrcPort: 123}.Build()
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want maps.Reason
	}{
		{"udp4 whole", udp4(), maps.ReasonOK},
		{"udp4 padded", pad(udp4(), 18), maps.ReasonOK},
		{"ipv4 total length 0", setLen(udp4(), 16, 0), maps.ReasonBadIPLen},
		{"ipv4 total length 19", setLen(udp4(), 16, 19), maps.ReasonBadIPLen},
		{"ipv4 total length past the frame", setLen(udp4(), 16, 29), maps.ReasonBadIPLen},
		{"udp4 cut by total length, ports in padding", pad(setLen(udp4()[:14+24], 16, 24), 20), maps.ReasonBadL4},
		{"ipv6 payload length past the frame", setLen(udp6(), 18, 9), maps.ReasonBadIPLen},
		{"udp6 cut by payload length, ports in padding", pad(setLen(udp6()[:14+44], 18, 4), 20), maps.ReasonBadL4},
		{"ipv6 payload length 0", setLen(udp6(), 18, 0)[:54], maps.ReasonBadL4},
		{"icmpv6 in ipv4", packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoICMPv6, DstPort: 128}.Build(), maps.ReasonICMPFamily},
		{"icmp in ipv6", packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoICMP, DstPort: 8}.Build(), maps.ReasonICMPFamily},
	} {
		if _, r := Parse(tc.b); r != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, maps.ReasonName(r), maps.ReasonName(tc.want))
		}
	}
}
