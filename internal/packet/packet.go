// Package packet crafts Ethernet frames for tests, benchmarks and the
// testbed's traffic generators: IPv4 (with options and fragments) and IPv6
// (with extension headers), TCP, UDP and ICMP, with up to two VLAN tags.
package packet

import (
	"encoding/binary"
	"net/netip"
)

// EtherTypes.
const (
	EtherTypeIPv4  = 0x0800
	EtherTypeIPv6  = 0x86dd
	EtherTypeARP   = 0x0806
	EtherType8021Q = 0x8100
	EtherTypeQinQ  = 0x88a8
)

// IP protocol numbers.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// Frame describes a frame to build. Zero values give sane defaults.
type Frame struct {
	SrcMAC, DstMAC [6]byte
	VLANs          []uint16 // outermost first; the first of two uses 802.1ad
	Src, Dst       netip.Addr
	Proto          uint8
	SrcPort        uint16
	DstPort        uint16 // ICMP: the type
	Payload        int    // payload bytes after the L4 header
	IPv4Options    []byte // multiple of 4 bytes
	FragOffset     uint16 // in 8-byte units; non-zero: a non-first fragment
	MoreFragments  bool
	IPv6Ext        []uint8 // extension header types inserted before L4 (0, 43, 60, 44, 51)
	// IPv6ExtLen, if set, gives each extension header's length field
	// (parallel to IPv6Ext): 8-byte units minus one for hop-by-hop, routing
	// and destination options, 4-byte units minus two for AH (at least 1).
	// Missing entries take the smallest valid length. Fragment headers
	// ignore it.
	IPv6ExtLen []uint8
	TCPFlags   uint8
}

// Build returns the frame's bytes.
func (f Frame) Build() []byte {
	b := make([]byte, 0, 128+f.Payload)
	b = append(b, f.DstMAC[:]...)
	b = append(b, f.SrcMAC[:]...)
	for i, v := range f.VLANs {
		tpid := uint16(EtherType8021Q)
		if i == 0 && len(f.VLANs) > 1 {
			tpid = EtherTypeQinQ
		}
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, v&0x0fff)
	}
	l4 := f.l4()
	if f.Src.Is4() {
		b = binary.BigEndian.AppendUint16(b, EtherTypeIPv4)
		b = append(b, f.ipv4(len(l4))...)
	} else {
		b = binary.BigEndian.AppendUint16(b, EtherTypeIPv6)
		b = append(b, f.ipv6(l4)...)
		return b
	}
	return append(b, l4...)
}

func (f Frame) l4() []byte {
	var h []byte
	switch f.Proto {
	case ProtoTCP:
		h = make([]byte, 20)
		binary.BigEndian.PutUint16(h[0:], f.SrcPort)
		binary.BigEndian.PutUint16(h[2:], f.DstPort)
		h[12] = 5 << 4
		h[13] = f.TCPFlags
		binary.BigEndian.PutUint16(h[14:], 65535)
	case ProtoUDP:
		h = make([]byte, 8)
		binary.BigEndian.PutUint16(h[0:], f.SrcPort)
		binary.BigEndian.PutUint16(h[2:], f.DstPort)
		binary.BigEndian.PutUint16(h[4:], uint16(8+f.Payload))
	case ProtoICMP, ProtoICMPv6:
		h = make([]byte, 8)
		h[0] = uint8(f.DstPort)
	}
	return append(h, make([]byte, f.Payload)...)
}

func (f Frame) ipv4(l4len int) []byte {
	hl := 20 + len(f.IPv4Options)
	h := make([]byte, hl)
	h[0] = 4<<4 | uint8(hl/4)
	binary.BigEndian.PutUint16(h[2:], uint16(hl+l4len))
	frag := f.FragOffset & 0x1fff
	if f.MoreFragments {
		frag |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8] = 64
	h[9] = f.Proto
	s, d := f.Src.As4(), f.dst4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	copy(h[20:], f.IPv4Options)
	binary.BigEndian.PutUint16(h[10:], checksum(h))
	return h
}

func (f Frame) dst4() [4]byte {
	if f.Dst.Is4() {
		return f.Dst.As4()
	}
	return [4]byte{198, 18, 0, 1}
}

func (f Frame) ipv6(l4 []byte) []byte {
	var ext []byte
	next := f.Proto
	for i := len(f.IPv6Ext) - 1; i >= 0; i-- {
		t := f.IPv6Ext[i]
		var e []byte
		switch t {
		case 44: // fragment
			e = make([]byte, 8)
			fo := f.FragOffset << 3
			if f.MoreFragments {
				fo |= 1
			}
			binary.BigEndian.PutUint16(e[2:], fo)
		case 51: // AH: length in 4-byte units minus 2
			n := max(f.extLen(i), 1)
			e = make([]byte, (int(n)+2)*4)
			e[1] = n
		default: // hop-by-hop, routing, destination options: 8-byte units minus 1
			n := f.extLen(i)
			e = make([]byte, (int(n)+1)*8)
			e[1] = n
		}
		e[0] = next
		next = t
		ext = append(e, ext...)
	}
	h := make([]byte, 40)
	h[0] = 6 << 4
	binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(l4)))
	h[6] = next
	h[7] = 64
	s := f.Src.As16()
	d := netip.MustParseAddr("fd00::1").As16()
	if f.Dst.Is6() {
		d = f.Dst.As16()
	}
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	h = append(h, ext...)
	return append(h, l4...)
}

func (f Frame) extLen(i int) uint8 {
	if i < len(f.IPv6ExtLen) {
		return f.IPv6ExtLen[i]
	}
	return 0
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// UDP4 is a shorthand for a UDP/IPv4 frame from src with a payload.
func UDP4(src string, sport, dport uint16, payload int) []byte {
	return Frame{Src: netip.MustParseAddr(src), Proto: ProtoUDP, SrcPort: sport, DstPort: dport, Payload: payload}.Build()
}
