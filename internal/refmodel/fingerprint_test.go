package refmodel

import (
	"net/netip"
	"testing"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
)

// TestParseFingerprintFields: the fields fingerprints match, as the
// program's parser fills them (IP total length, IPv6: 40 + payload length;
// TTL or hop limit; the TCP flags byte, 0 for other protocols).
func TestParseFingerprintFields(t *testing.T) {
	for _, tc := range []struct {
		name       string
		f          packet.Frame
		eth        int // bytes before the IP header
		flags, ttl uint8
	}{
		{"tcp4 syn-ack", packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoTCP, TCPFlags: 0x12, Payload: 100}, 14, 0x12, 64},
		{"udp4 in a vlan", packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoUDP, VLANs: []uint16{7}, Payload: 3}, 18, 0, 64},
		{"tcp6 fin", packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoTCP, TCPFlags: 0x01, Payload: 10}, 14, 0x01, 64},
	} {
		b := tc.f.Build()
		p, r := Parse(b)
		if r != maps.ReasonOK || p.IPLen != uint16(len(b)-tc.eth) || p.TTL != tc.ttl || p.TCPFlags != tc.flags {
			t.Errorf("%s: %+v (%s), want ip length %d, ttl %d, flags %#x", tc.name, p, maps.ReasonName(r), len(b)-tc.eth, tc.ttl, tc.flags)
		}
	}
}
