package refmodel

import (
	"encoding/binary"
	"net/netip"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// Bounds of the C parser (bpf/headers/edgeguard_parse.h).
const (
	MaxVLANTags = 2 // EG_MAX_VLAN_TAGS
	MaxIPv6Ext  = 6 // EG_MAX_IPV6_EXT
)

const (
	etherIPv4  = 0x0800
	etherIPv6  = 0x86dd
	ether8021Q = 0x8100
	ether8021A = 0x88a8

	protoHopOpts  = 0
	protoICMP     = 1
	protoTCP      = 6
	protoUDP      = 17
	protoRouting  = 43
	protoFragment = 44
	protoAH       = 51
	protoICMPv6   = 58
	protoDstOpts  = 60
)

// Packet is what the decision needs from a frame: the C struct pkt_info.
type Packet struct {
	Addr    [16]byte // source, IPv4 as IPv4-mapped IPv6
	Len     uint32   // whole frame length
	SrcPort uint16
	DstPort uint16 // ICMP: the type
	Proto   uint8
	HasL4   bool
	// For fingerprints (fingerprint.go): the IP total length (IPv6: 40 +
	// payload length), TTL or hop limit, and the TCP flags byte.
	IPLen    uint16
	TTL      uint8
	TCPFlags uint8
}

// Parse reads a frame exactly as the XDP program does. The reason is
// ReasonOK for an IP packet (with or without L4 fields), ReasonNonIP for
// other EtherTypes, or the malformed reason the program counts. Nothing
// past the end of the IP datagram (its length field) is read as a header.
func Parse(b []byte) (Packet, maps.Reason) {
	p := Packet{Len: uint32(len(b))}
	if len(b) < 14 {
		return p, maps.ReasonBadEth
	}
	pos := 14
	et := binary.BigEndian.Uint16(b[12:])
	for range MaxVLANTags {
		if !isVLAN(et) {
			break
		}
		if pos+4 > len(b) {
			return p, maps.ReasonBadVLAN
		}
		et = binary.BigEndian.Uint16(b[pos+2:])
		pos += 4
	}
	if isVLAN(et) {
		return p, maps.ReasonBadVLAN
	}
	var l4, dgramEnd int
	var r maps.Reason
	switch et {
	case etherIPv4:
		l4, dgramEnd, r = parseIPv4(b, &pos, &p)
	case etherIPv6:
		l4, dgramEnd, r = parseIPv6(b, &pos, &p)
	default:
		return p, maps.ReasonNonIP
	}
	if r != maps.ReasonOK || l4 < 0 {
		return p, r
	}
	return p, parseL4(b[:dgramEnd], pos, &p, uint8(l4))
}

func isVLAN(et uint16) bool { return et == ether8021Q || et == ether8021A }

// parseIPv4 returns the L4 protocol, or -1 for a non-first fragment, and
// where the datagram ends (by its total length).
func parseIPv4(b []byte, pos *int, p *Packet) (int, int, maps.Reason) {
	h := *pos
	if h+20 > len(b) {
		return 0, 0, maps.ReasonBadIPv4
	}
	if b[h]>>4 != 4 || b[h]&0x0f < 5 {
		return 0, 0, maps.ReasonBadIPv4
	}
	hlen := int(b[h]&0x0f) * 4
	if h+hlen > len(b) {
		return 0, 0, maps.ReasonBadIPv4
	}
	tot := int(binary.BigEndian.Uint16(b[h+2:]))
	if tot < hlen || h+tot > len(b) {
		return 0, 0, maps.ReasonBadIPLen
	}
	*pos = h + hlen
	p.IPLen, p.TTL = uint16(tot), b[h+8]
	p.Addr = [16]byte{10: 0xff, 11: 0xff}
	copy(p.Addr[12:], b[h+12:h+16])
	p.Proto = b[h+9]
	if p.Proto == protoICMPv6 {
		return 0, 0, maps.ReasonICMPFamily
	}
	if binary.BigEndian.Uint16(b[h+6:])&0x1fff != 0 {
		return -1, h + tot, maps.ReasonOK
	}
	return int(p.Proto), h + tot, maps.ReasonOK
}

// parseIPv6 walks at most MaxIPv6Ext extension headers, within the payload
// length; it returns the L4 protocol, or -1 for a non-first fragment or a
// chain it did not finish, and where the datagram ends.
func parseIPv6(b []byte, pos *int, p *Packet) (int, int, maps.Reason) {
	h := *pos
	if h+40 > len(b) {
		return 0, 0, maps.ReasonBadIPv6
	}
	if b[h]>>4 != 6 {
		return 0, 0, maps.ReasonBadIPv6
	}
	end := h + 40 + int(binary.BigEndian.Uint16(b[h+4:]))
	if end > len(b) {
		return 0, 0, maps.ReasonBadIPLen
	}
	p.IPLen, p.TTL = uint16(end-h), b[h+7]
	copy(p.Addr[:], b[h+8:h+24])
	if netip.AddrFrom16(p.Addr).Is4In6() {
		return 0, 0, maps.ReasonBadIPv6 // IPv4-mapped source: invalid on the wire
	}
	l4 := func(next uint8) (int, int, maps.Reason) {
		p.Proto = next
		if next == protoICMP {
			return 0, 0, maps.ReasonICMPFamily
		}
		return int(next), end, maps.ReasonOK
	}
	next := b[h+6]
	c := h + 40
	for range MaxIPv6Ext {
		switch next {
		case protoHopOpts, protoRouting, protoDstOpts:
			if c+2 > end {
				return 0, 0, maps.ReasonBadIPv6
			}
			next = b[c]
			c += (int(b[c+1]) + 1) * 8
		case protoAH:
			if c+2 > end || b[c+1] < 1 { // shorter than 12 bytes (RFC 4302 2.2)
				return 0, 0, maps.ReasonBadIPv6
			}
			next = b[c]
			c += (int(b[c+1]) + 2) * 4
		case protoFragment:
			if c+8 > end {
				return 0, 0, maps.ReasonBadIPv6
			}
			next = b[c]
			fragOff := binary.BigEndian.Uint16(b[c+2:])
			c += 8
			p.Proto = next
			if fragOff&0xfff8 != 0 {
				if next == protoICMP {
					return 0, 0, maps.ReasonICMPFamily
				}
				*pos = c
				return -1, end, maps.ReasonOK
			}
		default:
			*pos = c
			return l4(next)
		}
		if c > end {
			return 0, 0, maps.ReasonBadIPv6
		}
	}
	*pos = c
	switch next {
	case protoHopOpts, protoRouting, protoDstOpts, protoAH, protoFragment:
		p.Proto = next
		return -1, end, maps.ReasonOK // longer chain than walked: no L4
	}
	return l4(next)
}

// parseL4 reads ports (ICMP: the type as destination port) from b, which
// ends where the datagram does. Protocols without ports are not an error.
// TCP options must fit; their contents are not read.
func parseL4(b []byte, pos int, p *Packet, proto uint8) maps.Reason {
	switch proto {
	case protoTCP, protoUDP:
		need := 8
		if proto == protoTCP {
			need = 20
		}
		if pos+need > len(b) {
			return maps.ReasonBadL4
		}
		if proto == protoTCP {
			if doff := int(b[pos+12] >> 4); doff < 5 || pos+doff*4 > len(b) {
				return maps.ReasonBadL4
			}
		}
		p.SrcPort = binary.BigEndian.Uint16(b[pos:])
		p.DstPort = binary.BigEndian.Uint16(b[pos+2:])
		p.HasL4 = true
		if proto == protoTCP {
			p.TCPFlags = b[pos+13]
		}
	case protoICMP, protoICMPv6:
		if pos+8 > len(b) {
			return maps.ReasonBadL4
		}
		p.DstPort = uint16(b[pos])
		p.HasL4 = true
	}
	return maps.ReasonOK
}
