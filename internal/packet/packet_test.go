package packet

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

func TestEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Frame
		want Ends
	}{
		{"udp4", Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: ProtoUDP},
			Ends{Eth: 14, IP: 34, L4: 42}},
		{"tcp4 qinq options", Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: ProtoTCP, VLANs: []uint16{1, 2}, IPv4Options: make([]byte, 8)},
			Ends{Eth: 14, VLAN: []int{18, 22}, IP: 50, L4: 70}},
		{"icmp6 ext chain", Frame{Src: netip.MustParseAddr("fd00::1"), Proto: ProtoICMPv6, IPv6Ext: []uint8{0, 51, 44, 60}, IPv6ExtLen: []uint8{1, 4, 9, 0}},
			Ends{Eth: 14, IP: 54, Ext: []int{70, 94, 102, 110}, L4: 118}},
		{"gre6", Frame{Src: netip.MustParseAddr("fd00::1"), Proto: 47},
			Ends{Eth: 14, IP: 54, L4: 54}},
	} {
		got := tc.f.Ends()
		if got.Eth != tc.want.Eth || got.IP != tc.want.IP || got.L4 != tc.want.L4 ||
			len(got.VLAN) != len(tc.want.VLAN) || len(got.Ext) != len(tc.want.Ext) {
			t.Errorf("%s: ends %+v, want %+v", tc.name, got, tc.want)
			continue
		}
		for i := range got.VLAN {
			if got.VLAN[i] != tc.want.VLAN[i] {
				t.Errorf("%s: vlan ends %v, want %v", tc.name, got.VLAN, tc.want.VLAN)
			}
		}
		for i := range got.Ext {
			if got.Ext[i] != tc.want.Ext[i] {
				t.Errorf("%s: ext ends %v, want %v", tc.name, got.Ext, tc.want.Ext)
			}
		}
		if n := len(tc.f.Build()); n != got.L4 {
			t.Errorf("%s: built %d bytes, L4 header ends at %d", tc.name, n, got.L4)
		}
	}
}

// TestIPv6ExtChain walks the built chain by its own length fields.
func TestIPv6ExtChain(t *testing.T) {
	f := Frame{Src: netip.MustParseAddr("fd00::1"), Proto: ProtoUDP, SrcPort: 123,
		IPv6Ext: []uint8{0, 43, 51, 44, 60}, IPv6ExtLen: []uint8{2, 0, 3, 0, 1}, FragOffset: 0, MoreFragments: true}
	b := f.Build()
	next, off := b[14+6], 14+40
	for i, want := range f.IPv6Ext {
		if next != want {
			t.Fatalf("header %d: type %d, want %d", i, next, want)
		}
		next = b[off]
		switch want {
		case 44:
			if fo := binary.BigEndian.Uint16(b[off+2:]); fo != 1 {
				t.Errorf("fragment field %#x, want offset 0 with M set", fo)
			}
			off += 8
		case 51:
			off += (int(b[off+1]) + 2) * 4
		default:
			off += (int(b[off+1]) + 1) * 8
		}
	}
	if next != ProtoUDP || binary.BigEndian.Uint16(b[off:]) != 123 {
		t.Fatalf("after the chain: next %d, source port %d", next, binary.BigEndian.Uint16(b[off:]))
	}
	if pl := int(binary.BigEndian.Uint16(b[14+4:])); pl != len(b)-14-40 {
		t.Errorf("payload length %d, want %d", pl, len(b)-14-40)
	}
}

func TestARP(t *testing.T) {
	b := ARP(5, 6)
	if et := binary.BigEndian.Uint16(b[12:]); et != EtherTypeQinQ {
		t.Errorf("outer tpid %#x", et)
	}
	if et := binary.BigEndian.Uint16(b[20:]); et != EtherTypeARP {
		t.Errorf("ethertype %#x, want arp", et)
	}
	if len(b) != 14+8+28 {
		t.Errorf("length %d", len(b))
	}
}
