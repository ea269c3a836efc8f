package loader_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// The independent dissector is gopacket's layers: every header boundary,
// length check and field below is gopacket's decoding. Where the data plane
// has a rule gopacket does not (or the other way round), the rule is applied
// here explicitly, named "ours", and documented in docs/policy.md
// ("Malformed packets"):
//
//   - ours: an IPv4 version other than 4 or an IPv6 version other than 6 is
//     malformed (gopacket does not look at the version);
//   - ours: IPv4 total length 0 is malformed (gopacket reads it as TSO,
//     which a receiver's XDP program never sees) and IPv6 payload length 0
//     is an empty payload, as Linux reads it (no jumbograms on Ethernet;
//     gopacket refuses it without a jumbo option);
//   - ours: a v4-mapped IPv6 source is malformed;
//   - ours: more than 2 VLAN tags is malformed; after 6 IPv6 extension
//     headers the walk stops (no L4 fields, no opinion on what follows);
//   - ours: ICMP under the other family is malformed;
//   - ours: an ICMPv6 header has 8 bytes, as the kernel's icmp6hdr (gopacket
//     needs 4);
//   - out of scope: the contents of IPv4 options, IPv6 hop-by-hop,
//     destination and routing headers, TCP options and the UDP length field
//     are not judged by the data plane, so they are made neutral (NOPs, PAD1,
//     an unknown routing type, a UDP length of 8) before gopacket sees them.
//     Their lengths are kept, and gopacket checks those.

// dissection is the dissector's reading of a frame, in the data plane's
// terms: ReasonOK or ReasonNonIP for a frame that is not malformed, else
// the malformed reason; for an IP packet its source, protocol and, with L4
// fields, its ports (ICMP: the type as destination port).
type dissection struct {
	reason       maps.Reason
	src          netip.Addr
	proto        uint8
	sport, dport uint16
	hasL4        bool
}

func (d dissection) String() string {
	return fmt.Sprintf("%s src=%v proto=%d l4=%v sport=%d dport=%d", maps.ReasonName(d.reason), d.src, d.proto, d.hasL4, d.sport, d.dport)
}

// feedback is gopacket's DecodeFeedback: whether a layer was cut short.
type feedback struct{ truncated bool }

func (f *feedback) SetTruncated() { f.truncated = true }

// dissectVLANs is the data plane's bound on VLAN tags (EG_MAX_VLAN_TAGS);
// dissectIPv6Ext its bound on IPv6 extension headers (EG_MAX_IPV6_EXT).
const (
	dissectVLANs   = 2
	dissectIPv6Ext = 6
)

func dissect(frame []byte) dissection {
	b := bytes.Clone(frame) // neutralised in place
	var eth layers.Ethernet
	if eth.DecodeFromBytes(b, &feedback{}) != nil {
		return dissection{reason: maps.ReasonBadEth}
	}
	et, payload := eth.EthernetType, eth.Payload
	for tags := 0; et == layers.EthernetTypeDot1Q || et == layers.EthernetTypeQinQ; tags++ {
		var tag layers.Dot1Q
		if tags == dissectVLANs || tag.DecodeFromBytes(payload, &feedback{}) != nil {
			return dissection{reason: maps.ReasonBadVLAN}
		}
		et, payload = tag.Type, tag.Payload
	}
	switch et {
	case layers.EthernetTypeIPv4:
		return dissect4(payload)
	case layers.EthernetTypeIPv6:
		return dissect6(payload)
	}
	return dissection{reason: maps.ReasonNonIP}
}

func dissect4(b []byte) dissection {
	if len(b) > 0 && b[0]&0x0f >= 5 && int(b[0]&0x0f)*4 <= len(b) {
		fill(b[20:int(b[0]&0x0f)*4], 1) // out of scope: options become NOPs
	}
	var ip layers.IPv4
	var df feedback
	err := ip.DecodeFromBytes(b, &df)
	switch {
	case len(b) < 20 || b[0]>>4 != 4: // ours: the version
		return dissection{reason: maps.ReasonBadIPv4}
	case err != nil && (ip.IHL < 5 || int(ip.IHL)*4 > len(b)):
		// gopacket: IHL < 5, or the header is cut off by the frame
		return dissection{reason: maps.ReasonBadIPv4}
	case binary.BigEndian.Uint16(b[2:]) == 0: // ours: no TSO on receive
		return dissection{reason: maps.ReasonBadIPLen}
	case err != nil || df.truncated:
		// gopacket: a total length below 20 or IHL*4, or beyond the frame
		return dissection{reason: maps.ReasonBadIPLen}
	}
	src, _ := netip.AddrFromSlice(ip.SrcIP)
	d := dissection{src: src, proto: uint8(ip.Protocol)}
	if ip.Protocol == layers.IPProtocolICMPv6 { // ours
		d.reason = maps.ReasonICMPFamily
		return d
	}
	if ip.FragOffset != 0 {
		return d // a non-first fragment: no L4 header
	}
	// gopacket cut the payload at the total length; a first fragment's
	// L4 header is decoded too (gopacket stops at any fragment).
	return dissectL4(d, ip.Payload)
}

func dissect6(b []byte) dissection {
	var next uint8
	if len(b) >= 40 {
		// gopacket decodes a hop-by-hop header inside the IPv6 layer,
		// judging its options; it is walked below instead, like the others.
		next, b[6] = b[6], uint8(layers.IPProtocolNoNextHeader)
	}
	var ip layers.IPv6
	var df feedback
	err := ip.DecodeFromBytes(b, &df)
	// gopacket refuses payload length 0 without a jumbo option; ours
	// (and Linux's ip6_rcv_core) reads it as an empty payload, below.
	if len(b) < 40 || (err != nil && ip.Length != 0) || ip.Version != 6 { // ours: the version
		return dissection{reason: maps.ReasonBadIPv6}
	}
	if df.truncated { // gopacket: the payload length runs past the frame
		return dissection{reason: maps.ReasonBadIPLen}
	}
	src := netip.AddrFrom16([16]byte(ip.SrcIP))
	if src.Is4In6() { // ours
		return dissection{reason: maps.ReasonBadIPv6}
	}
	d := dissection{src: src}
	payload := ip.Payload // gopacket cut it at the payload length
	if ip.Length == 0 {
		payload = nil // ours: no jumbograms
	}
	for range dissectIPv6Ext {
		switch layers.IPProtocol(next) {
		case layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Routing:
			if len(payload) >= 2 && (int(payload[1])+1)*8 <= len(payload) {
				// out of scope: options become PAD1, the routing type
				// one gopacket does not interpret
				fill(payload[2:(int(payload[1])+1)*8], 0)
				if next == uint8(layers.IPProtocolIPv6Routing) {
					payload[2] = 253
				}
			}
			var x layers.IPv6ExtensionSkipper
			if x.DecodeFromBytes(payload, &feedback{}) != nil {
				return dissection{reason: maps.ReasonBadIPv6}
			}
			next, payload = uint8(x.NextHeader), x.Payload
		case layers.IPProtocolAH:
			var ah layers.IPSecAH
			if ah.DecodeFromBytes(payload, &feedback{}) != nil {
				return dissection{reason: maps.ReasonBadIPv6}
			}
			next, payload = uint8(ah.NextHeader), ah.Payload
		case layers.IPProtocolIPv6Fragment:
			var fr layers.IPv6Fragment
			if fr.DecodeFromBytes(payload, &feedback{}) != nil {
				return dissection{reason: maps.ReasonBadIPv6}
			}
			next, payload = uint8(fr.NextHeader), fr.Payload
			if fr.FragmentOffset != 0 {
				d.proto = next
				if next == uint8(layers.IPProtocolICMPv4) { // ours
					d.reason = maps.ReasonICMPFamily
				}
				return d // a non-first fragment: no L4 header
			}
		default:
			return l4of6(d, next, payload)
		}
	}
	switch layers.IPProtocol(next) {
	case layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Destination, layers.IPProtocolIPv6Routing,
		layers.IPProtocolAH, layers.IPProtocolIPv6Fragment:
		d.proto = next // ours: past the walk, no L4 fields
		return d
	}
	return l4of6(d, next, payload)
}

func l4of6(d dissection, next uint8, payload []byte) dissection {
	d.proto = next
	if next == uint8(layers.IPProtocolICMPv4) { // ours
		d.reason = maps.ReasonICMPFamily
		return d
	}
	return dissectL4(d, payload)
}

// dissectL4 decodes the L4 header of d.proto from the datagram's payload.
func dissectL4(d dissection, b []byte) dissection {
	bad := dissection{reason: maps.ReasonBadL4}
	switch layers.IPProtocol(d.proto) {
	case layers.IPProtocolTCP:
		if len(b) >= 20 {
			if n := int(b[12]>>4) * 4; n >= 20 && n <= len(b) {
				fill(b[20:n], 1) // out of scope: options become NOPs
			}
		}
		var t layers.TCP
		if t.DecodeFromBytes(b, &feedback{}) != nil {
			return bad
		}
		d.sport, d.dport = uint16(t.SrcPort), uint16(t.DstPort)
	case layers.IPProtocolUDP:
		if len(b) >= 8 {
			binary.BigEndian.PutUint16(b[4:], 8) // out of scope: the UDP length
		}
		var u layers.UDP
		if u.DecodeFromBytes(b, &feedback{}) != nil {
			return bad
		}
		d.sport, d.dport = uint16(u.SrcPort), uint16(u.DstPort)
	case layers.IPProtocolICMPv4:
		var ic layers.ICMPv4
		if ic.DecodeFromBytes(b, &feedback{}) != nil {
			return bad
		}
		d.dport = uint16(ic.TypeCode.Type())
	case layers.IPProtocolICMPv6:
		var ic layers.ICMPv6
		if ic.DecodeFromBytes(b, &feedback{}) != nil || len(b) < 8 { // ours: 8 bytes
			return bad
		}
		d.dport = uint16(ic.TypeCode.Type())
	default:
		return d // no ports: tunnels, ESP, AH in IPv4, SCTP, ...
	}
	d.hasL4 = true
	return d
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// parseVerdict is the verdict of a dissected frame under parsePolicy (its
// rules: udp source port 123, tcp destination port 80, icmp type 8, icmpv6
// type 128, then udp without ports, then the source range, then the
// default; malformed frames are dropped).
func parseVerdict(d dissection) verdict {
	switch d.reason {
	case maps.ReasonOK:
	case maps.ReasonNonIP:
		return passed(maps.ReasonNonIP)
	default:
		return dropped(d.reason)
	}
	if d.hasL4 {
		switch {
		case d.proto == packet.ProtoUDP && d.sport == 123:
			return okRule(pNTP)
		case d.proto == packet.ProtoTCP && d.dport == 80:
			return okRule(pWeb)
		case d.proto == packet.ProtoICMP && d.dport == 8:
			return okRule(pEcho)
		case d.proto == packet.ProtoICMPv6 && d.dport == 128:
			return okRule(pEcho6)
		}
	}
	if d.proto == packet.ProtoUDP {
		return okRule(pUDP)
	}
	if netip.MustParsePrefix("198.18.6.0/24").Contains(d.src) || netip.MustParsePrefix("fd00:6::/32").Contains(d.src) {
		return okRule(pSrcRange)
	}
	return okRule(pDefault)
}

// modelAgrees reports how the reference model's parse of frame differs
// from the dissection d, or "" when it does not.
func modelAgrees(frame []byte, d dissection) string {
	p, r := refmodel.Parse(frame)
	got := dissection{reason: r}
	if r == maps.ReasonOK {
		got.src = netip.AddrFrom16(p.Addr).Unmap()
		got.proto, got.sport, got.dport, got.hasL4 = p.Proto, p.SrcPort, p.DstPort, p.HasL4
	}
	want := d
	if want.reason != maps.ReasonOK {
		want = dissection{reason: d.reason}
	}
	if got != want {
		return fmt.Sprintf("model %s, dissector %s", got, want)
	}
	return ""
}

// TestParserDissector checks every parser case against the dissector: the
// verdict written by hand, the reference model's reading and the program's
// verdict must all be the dissector's.
func TestParserDissector(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(parsePolicy())
	td.setClock(0)
	c := newChecker(td)
	for _, tc := range parserCases() {
		d := dissect(tc.frame)
		want := parseVerdict(d)
		if want != tc.want {
			t.Errorf("%s: written %s, dissector %s (%s)", tc.name, tc.want, want, d)
		}
		if diff := modelAgrees(tc.frame, d); diff != "" {
			t.Errorf("%s: %s", tc.name, diff)
		}
		c.send(tc.name, tc.frame, want)
	}
}

// TestDissectorSees makes sure the dissector is not a copy of the parser
// that agrees with anything: frames whose reading it must get right on
// its own, fields included.
func TestDissectorSees(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00:1::10")
	for _, tc := range []struct {
		name  string
		frame []byte
		want  dissection
	}{
		{"udp4", ntp(v4).Build(), dissection{src: v4, proto: 17, sport: 123, dport: 40000, hasL4: true}},
		{"tcp6 after hop-by-hop and ah", packet.Frame{Src: v6, Proto: packet.ProtoTCP, SrcPort: 7, DstPort: 80, IPv6Ext: []uint8{0, 51}}.Build(),
			dissection{src: v6, proto: 6, sport: 7, dport: 80, hasL4: true}},
		{"udp4 ports in the padding", padded(cutDatagram(ntp(v4), 14+20+4), 40), dissection{reason: maps.ReasonBadL4}},
		{"udp6 cut by the payload length", padded(cutDatagram(ntp(v6), 14+40+7), 40), dissection{reason: maps.ReasonBadL4}},
		{"ipv4 total length past the frame", withIPLen(ntp(v4).Build(), 14, 200), dissection{reason: maps.ReasonBadIPLen}},
		{"ipv4 total length below ihl*4", withIPLen(ntp(v4).Build(), 14, 19), dissection{reason: maps.ReasonBadIPLen}},
		{"icmpv6 type 128", packet.Frame{Src: v6, Proto: packet.ProtoICMPv6, DstPort: 128}.Build(), dissection{src: v6, proto: 58, dport: 128, hasL4: true}},
		{"gre", packet.Frame{Src: v4, Proto: protoGRE}.Build(), dissection{src: v4, proto: 47}},
		{"arp", packet.ARP(), dissection{reason: maps.ReasonNonIP}},
	} {
		if got := dissect(tc.frame); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// FuzzFrames sends whole frames of the fuzzer's making through the program
// (BPF_PROG_TEST_RUN) under parsePolicy: its verdict, counters and the rule
// it lands on must be the dissector's, and the reference model must read
// the frame as the dissector does. Frames BPF_PROG_TEST_RUN cannot send
// whole (see diffHarness.step) are compared between model and dissector
// only. The seed corpus is parserCases and testdata/fuzz/FuzzFrames.
//
//	go test -run '^$' -fuzz FuzzFrames -fuzztime 100000x -parallel 1 ./internal/loader/
//
// (A count, not a duration: see FuzzDifferential.)
func FuzzFrames(f *testing.F) {
	for _, tc := range parserCases() {
		f.Add(tc.frame)
	}
	td := newTestDatapath(f, smallSizes)
	td.apply(parsePolicy())
	td.setClock(0)
	// Not newChecker: its final comparison would run after the last
	// input's t has finished. Every send compares its own counter cell.
	c := &checker{td: td, base: td.counters(), wantRules: map[uint32]maps.RuleCounters{}, baseRules: map[uint32]maps.RuleCounters{}}
	f.Fuzz(func(t *testing.T, frame []byte) {
		td.tb = t
		d := dissect(frame)
		name := "frame " + hex.EncodeToString(frame[:min(len(frame), 96)])
		if diff := modelAgrees(frame, d); diff != "" {
			t.Fatalf("%s: %s", name, diff)
		}
		if len(frame) < minTestRunFrame || len(frame) > maxTestRunLinear {
			return
		}
		c.send(name, frame, parseVerdict(d))
	})
}
