package packet

import "encoding/binary"

// Ends are the offsets at which each header of a built frame ends, for
// tests that cut a frame at every header boundary.
type Ends struct {
	Eth  int   // end of the Ethernet header (14)
	VLAN []int // end of each VLAN tag, outermost first
	IP   int   // end of the IPv4 header (with options) or the fixed IPv6 header
	Ext  []int // end of each IPv6 extension header
	L4   int   // end of the L4 header (== the last of the above if no L4 header)
}

// Ends returns where the headers of f.Build() end.
func (f Frame) Ends() Ends {
	e := Ends{Eth: 14}
	off := 14
	for range f.VLANs {
		off += 4
		e.VLAN = append(e.VLAN, off)
	}
	if f.Src.Is4() {
		off += 20 + len(f.IPv4Options)
		e.IP = off
	} else {
		off += 40
		e.IP = off
		for i, t := range f.IPv6Ext {
			switch t {
			case 44:
				off += 8
			case 51:
				off += (int(max(f.extLen(i), 1)) + 2) * 4
			default:
				off += (int(f.extLen(i)) + 1) * 8
			}
			e.Ext = append(e.Ext, off)
		}
	}
	e.L4 = off + f.l4HeaderLen()
	return e
}

func (f Frame) l4HeaderLen() int {
	switch f.Proto {
	case ProtoTCP:
		return 20
	case ProtoUDP, ProtoICMP, ProtoICMPv6:
		return 8
	}
	return 0
}

// ARP returns a broadcast ARP request frame, inside the given VLAN tags.
func ARP(vlans ...uint16) []byte {
	b := make([]byte, 0, 64)
	b = append(b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	b = append(b, 0x02, 0, 0, 0, 0, 1)
	for i, v := range vlans {
		tpid := uint16(EtherType8021Q)
		if i == 0 && len(vlans) > 1 {
			tpid = EtherTypeQinQ
		}
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, v&0x0fff)
	}
	b = binary.BigEndian.AppendUint16(b, EtherTypeARP)
	// htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4, op 1 (request),
	// sender 02:00:00:00:00:01 198.18.0.2, target 198.18.0.1.
	b = append(b, 0, 1, 0x08, 0x00, 6, 4, 0, 1)
	b = append(b, 0x02, 0, 0, 0, 0, 1, 198, 18, 0, 2)
	b = append(b, 0, 0, 0, 0, 0, 0, 198, 18, 0, 1)
	return b
}
