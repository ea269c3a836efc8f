package loader_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// verdict is what one packet should get: an action, a reason and, when the
// packet reached a rule, the rule it is counted under.
type verdict struct {
	action maps.Action
	reason maps.Reason
	rule   uint32
	ruled  bool
}

func passed(r maps.Reason) verdict { return verdict{action: maps.ActPass, reason: r} }
func okRule(id uint32) verdict {
	return verdict{action: maps.ActPass, reason: maps.ReasonOK, rule: id, ruled: true}
}
func dropped(r maps.Reason) verdict { return verdict{action: maps.ActDrop, reason: r} }
func limitedBy(r maps.Reason, id uint32) verdict {
	return verdict{action: maps.ActDrop, reason: r, rule: id, ruled: true}
}
func wouldDrop(r maps.Reason, id uint32) verdict {
	return verdict{action: maps.ActWouldDrop, reason: r, rule: id, ruled: true}
}

func (v verdict) String() string {
	s := maps.ActionName(v.action) + "/" + maps.ReasonName(v.reason)
	if v.ruled {
		s += " under rule " + itoa(v.rule)
	}
	return s
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// checker sends frames and checks each packet's verdict against the
// counters: the XDP action, the one (action, reason) cell that must move
// by exactly this packet, and the rule's counters. It keeps the totals it
// expects and compares every counter at the end.
type checker struct {
	td        *testDatapath
	base      maps.Counters
	want      maps.Counters
	wantRules map[uint32]maps.RuleCounters
	baseRules map[uint32]maps.RuleCounters
}

func newChecker(td *testDatapath) *checker {
	td.tb.Helper()
	c := &checker{td: td, base: td.counters(), wantRules: map[uint32]maps.RuleCounters{}, baseRules: map[uint32]maps.RuleCounters{}}
	td.tb.Cleanup(func() {
		if !td.tb.Failed() {
			c.final()
		}
	})
	return c
}

// cell reads one counter of interface slot 0, where BPF_PROG_TEST_RUN
// packets are counted (their ingress interface, lo, has no slot).
func (c *checker) cell(a maps.Action, r maps.Reason) maps.Counter {
	c.td.tb.Helper()
	var per []loader.LimiterEgCounter
	idx := uint32(a)*uint32(loader.LimiterEgReasonEG_R_MAX) + uint32(r)
	if err := c.td.d.Objects.Stats.Lookup(idx, &per); err != nil {
		c.td.tb.Fatalf("read counter %d: %v", idx, err)
	}
	var out maps.Counter
	for _, p := range per {
		out.Packets += p.Packets
		out.Bytes += p.Bytes
	}
	return out
}

func (c *checker) ruleCounters(id uint32) maps.RuleCounters {
	c.td.tb.Helper()
	rc, err := c.td.m.Counters.Rules([]uint32{id})
	if err != nil {
		c.td.tb.Fatal(err)
	}
	got, ok := rc[id]
	if !ok {
		c.td.tb.Fatalf("rule %d is not in the live generation", id)
	}
	return got
}

// send runs frame and checks that it got w.
func (c *checker) send(name string, frame []byte, w verdict) {
	tb := c.td.tb
	tb.Helper()
	if w.ruled {
		if _, seen := c.baseRules[w.rule]; !seen {
			c.baseRules[w.rule] = c.ruleCounters(w.rule)
		}
	}
	before := c.cell(w.action, w.reason)
	ret := c.td.run(frame)
	wantRet := uint32(xdpPass)
	if w.action == maps.ActDrop {
		wantRet = xdpDrop
	}
	if ret != wantRet {
		tb.Errorf("%s: XDP action %d, want %d (%s)", name, ret, wantRet, w)
	}
	n := uint64(len(frame))
	after := c.cell(w.action, w.reason)
	if after.Packets != before.Packets+1 || after.Bytes != before.Bytes+n {
		all := c.td.counters()
		tb.Fatalf("%s: want %s: counter %s/%s moved by %d packets, %d bytes (want 1, %d); all non-zero counters: %s",
			name, w, maps.ActionName(w.action), maps.ReasonName(w.reason),
			after.Packets-before.Packets, after.Bytes-before.Bytes, n, nonZero(all, c.base, c.want))
	}
	c.want[w.action][w.reason].Packets++
	c.want[w.action][w.reason].Bytes += n
	if w.ruled {
		rc := c.wantRules[w.rule]
		rc[w.action].Packets++
		rc[w.action].Bytes += n
		c.wantRules[w.rule] = rc
		got := c.ruleCounters(w.rule)
		base := c.baseRules[w.rule]
		for a := range got {
			if got[a].Packets-base[a].Packets != rc[a].Packets || got[a].Bytes-base[a].Bytes != rc[a].Bytes {
				tb.Fatalf("%s: rule %d counters %v (since start), want %v", name, w.rule, sub(got, base), rc)
			}
		}
	}
}

// sync follows a policy change: a rule id that left the live generation
// loses its counters (its table slot is cleared when the id comes back).
func (c *checker) sync() {
	c.td.tb.Helper()
	live, err := c.td.m.Generations.RuleSlots()
	if err != nil {
		c.td.tb.Fatal(err)
	}
	for id := range c.baseRules {
		if _, ok := live[id]; !ok {
			delete(c.baseRules, id)
			delete(c.wantRules, id)
		}
	}
}

func sub(a, b maps.RuleCounters) maps.RuleCounters {
	for i := range a {
		a[i].Packets -= b[i].Packets
		a[i].Bytes -= b[i].Bytes
	}
	return a
}

// nonZero lists the counters that differ from what was expected so far.
func nonZero(all, base, want maps.Counters) string {
	s := ""
	for a := range all {
		for r := range all[a] {
			got := maps.Counter{Packets: all[a][r].Packets - base[a][r].Packets, Bytes: all[a][r].Bytes - base[a][r].Bytes}
			if got != want[a][r] {
				s += " " + maps.ActionName(maps.Action(a)) + "/" + maps.ReasonName(maps.Reason(r)) +
					"=" + itoa(uint32(got.Packets)) + " (expected " + itoa(uint32(want[a][r].Packets)) + ")"
			}
		}
	}
	return s
}

// final compares every counter, of every interface slot, with the totals
// expected from the verdicts checked so far.
func (c *checker) final() {
	tb := c.td.tb
	tb.Helper()
	all := c.td.counters()
	for a := range all {
		for r := range all[a] {
			got := maps.Counter{Packets: all[a][r].Packets - c.base[a][r].Packets, Bytes: all[a][r].Bytes - c.base[a][r].Bytes}
			if got != c.want[a][r] {
				tb.Errorf("counter %s/%s = %+v, want %+v", maps.ActionName(maps.Action(a)), maps.ReasonName(maps.Reason(r)), got, c.want[a][r])
			}
		}
	}
}

// Rules of the parser policy. Every rule passes everything: which rule a
// packet lands on shows what the parser read from it.
const (
	pDefault  = 0 // no L4 rule, no prefix: the source's default
	pNTP      = 1 // udp source port 123
	pWeb      = 2 // tcp destination port 80
	pEcho     = 3 // icmp type 8
	pUDP      = 4 // udp, any port (what a packet without L4 fields gets)
	pEcho6    = 5 // icmpv6 type 128
	pSrcRange = 6 // source 198.18.6.0/24 and fd00:6::/32
)

func parsePolicy() policy.Compiled {
	g := policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictDrop,
		Prefixes: []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.18.6.0/24"), RuleID: pSrcRange},
			{Prefix: netip.MustParsePrefix("fd00:6::/32"), RuleID: pSrcRange},
		},
		L4: []policy.L4Entry{
			{Protocol: packet.ProtoUDP, Dir: policy.PortSrc, Port: 123, RuleID: pNTP},
			{Protocol: packet.ProtoTCP, Dir: policy.PortDst, Port: 80, RuleID: pWeb},
			{Protocol: packet.ProtoICMP, Dir: policy.PortDst, Port: 8, RuleID: pEcho},
			{Protocol: packet.ProtoUDP, Dir: policy.PortAny, RuleID: pUDP},
			{Protocol: packet.ProtoICMPv6, Dir: policy.PortDst, Port: 128, RuleID: pEcho6},
		},
	}
	for id := uint32(pDefault); id <= pSrcRange; id++ {
		g.Rules = append(g.Rules, policy.CompiledRule{ID: id, SourceKey: policy.KeyBits{V4: 32, V6: 64}})
	}
	return g
}

var (
	v4Src   = netip.MustParseAddr("198.18.0.10")
	v4Range = netip.MustParseAddr("198.18.6.10")
	v6Src   = netip.MustParseAddr("fd00:1::10")
	v6Range = netip.MustParseAddr("fd00:6::10")
)

const protoGRE = 47

func ntp(src netip.Addr) packet.Frame {
	return packet.Frame{Src: src, Proto: packet.ProtoUDP, SrcPort: 123, DstPort: 40000, Payload: 48}
}

func with(b []byte, off int, val byte) []byte {
	b[off] = val
	return b
}

// ipStart is where the IP header of f.Build() starts.
func ipStart(f packet.Frame) int { return 14 + 4*len(f.VLANs) }

// withIPLen sets the length field of the IP header at off: the IPv4 total
// length, or the IPv6 payload length (n - 40), for a datagram of n bytes.
// The IPv4 checksum is left stale: nothing on the XDP path checks it.
func withIPLen(b []byte, off, n int) []byte {
	if b[off]>>4 == 6 {
		binary.BigEndian.PutUint16(b[off+4:], uint16(n-40))
	} else {
		binary.BigEndian.PutUint16(b[off+2:], uint16(n))
	}
	return b
}

// cutDatagram cuts f's frame at n bytes and sets the IP length to match:
// a well-formed datagram that ends at n (inside a header, when n is).
func cutDatagram(f packet.Frame, n int) []byte {
	b := f.Build()[:n]
	return withIPLen(b, ipStart(f), n-ipStart(f))
}

// padded appends n bytes of Ethernet padding (or a trailer) after the
// datagram: bytes the parser must not read as headers.
func padded(b []byte, n int) []byte {
	pad := make([]byte, n)
	for i := range pad {
		pad[i] = 0x7b // 123: a port, a type, a header length that would all "match"
	}
	return append(b, pad...)
}

// withProto sets the IPv4 protocol or the IPv6 next header of f's frame.
func withProto(f packet.Frame, proto uint8) []byte {
	b := f.Build()
	off := ipStart(f) + 9
	if !f.Src.Is4() {
		off = ipStart(f) + 6
	}
	b[off] = proto
	return b
}

// withTCPDataOffset sets the data offset of the TCP header at the end of
// f's IP headers (f has no extension headers).
func withTCPDataOffset(f packet.Frame, doff uint8) []byte {
	b := f.Build()
	e := f.Ends()
	b[e.L4-20+12] = doff << 4
	return b
}

// parserCase is a frame and the verdict it gets under parsePolicy.
type parserCase struct {
	name  string
	frame []byte
	want  verdict
}

// TestParserBranches sends a frame down every branch of the parser and
// checks, through the rule it lands on, what the parser read.
func TestParserBranches(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(parsePolicy())
	td.setClock(0)
	c := newChecker(td)
	for _, tc := range parserCases() {
		c.send(tc.name, tc.frame, tc.want)
	}
}

// parserCases are frames down every branch of the parser, with the
// verdicts written by hand (TestParserDissector checks them against an
// independent dissector).
func parserCases() []parserCase {
	chain := func(src netip.Addr, ext ...uint8) packet.Frame {
		f := ntp(src)
		f.IPv6Ext = ext
		return f
	}
	withLen := func(f packet.Frame, lens ...uint8) packet.Frame {
		f.IPv6ExtLen = lens
		return f
	}
	frag := func(f packet.Frame, off uint16, more bool) packet.Frame {
		f.FragOffset, f.MoreFragments = off, more
		if !f.Src.Is4() {
			f.IPv6Ext = append(f.IPv6Ext, 44)
		}
		return f
	}
	tagged := func(f packet.Frame, tags ...uint16) packet.Frame {
		f.VLANs = tags
		return f
	}
	opts := func(f packet.Frame, n int) packet.Frame {
		f.IPv4Options = make([]byte, n)
		return f
	}
	nonFirstCut := frag(ntp(v4Src), 185, false)

	return []parserCase{
		// Ethernet and VLAN tags.
		{"arp", packet.ARP(), passed(maps.ReasonNonIP)},
		{"arp in one tag", packet.ARP(10), passed(maps.ReasonNonIP)},
		{"arp in qinq", packet.ARP(10, 20), passed(maps.ReasonNonIP)},
		{"arp in three tags", packet.ARP(10, 20, 30), dropped(maps.ReasonBadVLAN)},
		{"udp4 untagged", ntp(v4Src).Build(), okRule(pNTP)},
		{"udp4 in 802.1q", tagged(ntp(v4Src), 10).Build(), okRule(pNTP)},
		{"udp4 in qinq", tagged(ntp(v4Src), 10, 20).Build(), okRule(pNTP)},
		{"udp6 in qinq", tagged(ntp(v6Src), 10, 20).Build(), okRule(pNTP)},
		{"source after qinq", tagged(packet.Frame{Src: v4Range, Proto: protoGRE}, 10, 20).Build(), okRule(pSrcRange)},
		{"udp4 in three tags", tagged(ntp(v4Src), 10, 20, 30).Build(), dropped(maps.ReasonBadVLAN)},
		{"udp6 in three tags", tagged(ntp(v6Src), 10, 20, 30).Build(), dropped(maps.ReasonBadVLAN)},
		{"unknown ethertype", with(ntp(v4Src).Build(), 12, 0x88), passed(maps.ReasonNonIP)},

		// L4 fields.
		{"udp other port: protocol rule", packet.UDP4("198.18.0.10", 5000, 53, 10), okRule(pUDP)},
		{"tcp dport 80", packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, SrcPort: 5000, DstPort: 80}.Build(), okRule(pWeb)},
		{"tcp sport 80 is not dport 80", packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, SrcPort: 80, DstPort: 5000}.Build(), okRule(pDefault)},
		{"icmp echo: type as port", packet.Frame{Src: v4Src, Proto: packet.ProtoICMP, DstPort: 8}.Build(), okRule(pEcho)},
		{"icmp echo reply", packet.Frame{Src: v4Src, Proto: packet.ProtoICMP, DstPort: 0}.Build(), okRule(pDefault)},
		{"icmpv6 echo", packet.Frame{Src: v6Src, Proto: packet.ProtoICMPv6, DstPort: 128}.Build(), okRule(pEcho6)},
		{"gre: no ports, source rule", packet.Frame{Src: v4Range, Proto: protoGRE}.Build(), okRule(pSrcRange)},
		{"gre6: no ports, source rule", packet.Frame{Src: v6Range, Proto: protoGRE}.Build(), okRule(pSrcRange)},

		// IPv4 header.
		{"ipv4 options 4 bytes", opts(ntp(v4Src), 4).Build(), okRule(pNTP)},
		{"ipv4 options 40 bytes (ihl 15)", opts(ntp(v4Src), 40).Build(), okRule(pNTP)},
		{"ipv4 ihl 4", with(ntp(v4Src).Build(), 14, 0x44), dropped(maps.ReasonBadIPv4)},
		{"ipv4 ihl 0", with(ntp(v4Src).Build(), 14, 0x40), dropped(maps.ReasonBadIPv4)},
		{"ipv4 version 6", with(ntp(v4Src).Build(), 14, 0x65), dropped(maps.ReasonBadIPv4)},
		{"ipv4 ihl past the frame", with(packet.Frame{Src: v4Src, Proto: protoGRE}.Build(), 14, 0x4f), dropped(maps.ReasonBadIPv4)},
		{"ipv6 version 4", with(ntp(v6Src).Build(), 14, 0x40), dropped(maps.ReasonBadIPv6)},

		// IPv4 fragments: the first has L4, the others are limited by source.
		{"ipv4 first fragment", frag(ntp(v4Src), 0, true).Build(), okRule(pNTP)},
		{"ipv4 non-first fragment: no ports", frag(ntp(v4Src), 185, true).Build(), okRule(pUDP)},
		{"ipv4 last fragment: no ports", frag(ntp(v4Src), 185, false).Build(), okRule(pUDP)},
		{"ipv4 non-first fragment, source rule", frag(packet.Frame{Src: v4Range, Proto: packet.ProtoTCP, DstPort: 80}, 1, true).Build(), okRule(pSrcRange)},
		{"ipv4 non-first fragment cut after the ip header", cutDatagram(nonFirstCut, nonFirstCut.Ends().IP), okRule(pUDP)},
		{"ipv4 non-first fragment cut after the ip header, padded", padded(cutDatagram(nonFirstCut, nonFirstCut.Ends().IP), 20), okRule(pUDP)},

		// IPv6 extension headers.
		{"ipv6 hop-by-hop", chain(v6Src, 0).Build(), okRule(pNTP)},
		{"ipv6 routing", chain(v6Src, 43).Build(), okRule(pNTP)},
		{"ipv6 destination options", chain(v6Src, 60).Build(), okRule(pNTP)},
		{"ipv6 ah", chain(v6Src, 51).Build(), okRule(pNTP)},
		{"ipv6 first fragment", frag(ntp(v6Src), 0, true).Build(), okRule(pNTP)},
		{"ipv6 long hop-by-hop (32 bytes)", withLen(chain(v6Src, 0), 3).Build(), okRule(pNTP)},
		{"ipv6 long ah (24 bytes)", withLen(chain(v6Src, 51), 4).Build(), okRule(pNTP)},
		{"ipv6 long destination options (2 KiB)", withLen(chain(v6Src, 60), 255).Build(), okRule(pNTP)},
		{"ipv6 non-first fragment: no ports", frag(ntp(v6Src), 185, true).Build(), okRule(pUDP)},
		{"ipv6 non-first fragment after hop-by-hop", frag(chain(v6Src, 0), 3, false).Build(), okRule(pUDP)},
		{"ipv6 non-first fragment, source rule", frag(packet.Frame{Src: v6Range, Proto: packet.ProtoTCP, DstPort: 80}, 9, true).Build(), okRule(pSrcRange)},
		{"ipv6 chain of 5", chain(v6Src, 0, 43, 60, 51, 60).Build(), okRule(pNTP)},
		{"ipv6 chain of 5 with a first fragment", chain(v6Src, 0, 43, 44, 51, 60).Build(), okRule(pNTP)},
		// Longer than EG_MAX_IPV6_EXT (6): the walk stops at the seventh
		// header; its type is the protocol, there are no ports, and the
		// packet is limited by its source.
		{"ipv6 chain of 7: source rule", chain(v6Range, 0, 43, 60, 51, 60, 60, 60).Build(), okRule(pSrcRange)},
		{"ipv6 chain of 7: no udp rule", chain(v6Src, 0, 43, 60, 51, 60, 60, 60).Build(), okRule(pDefault)},
		{"ipv6 chain of 9 truncated past the walk", cutDatagram(chain(v6Src, 0, 43, 60, 51, 60, 60, 60, 60, 60), 14+40+6*8+4), okRule(pDefault)},

		// IP length fields (strict parsing: nothing past the datagram
		// is a header).
		{"ipv4 total length 0", withIPLen(ntp(v4Src).Build(), 14, 0), dropped(maps.ReasonBadIPLen)},
		{"ipv4 total length 19", withIPLen(ntp(v4Src).Build(), 14, 19), dropped(maps.ReasonBadIPLen)},
		{"ipv4 total length below ihl*4 (options)", withIPLen(opts(ntp(v4Src), 8).Build(), 14, 27), dropped(maps.ReasonBadIPLen)},
		{"ipv4 total length = ihl*4: no l4 header", withIPLen(ntp(v4Src).Build(), 14, 20), dropped(maps.ReasonBadL4)},
		{"ipv4 total length past the frame by one", withIPLen(ntp(v4Src).Build(), 14, 20+8+48+1), dropped(maps.ReasonBadIPLen)},
		{"ipv4 total length 65535", withIPLen(ntp(v4Src).Build(), 14, 65535), dropped(maps.ReasonBadIPLen)},
		{"udp4 header cut by total length, ports in the padding", padded(cutDatagram(ntp(v4Src), 14+20+4), 40), dropped(maps.ReasonBadL4)},
		{"udp4 header cut by total length, qinq", padded(cutDatagram(tagged(ntp(v4Src), 1, 2), 22+20+7), 40), dropped(maps.ReasonBadL4)},
		{"udp4 exactly its header, padded", padded(cutDatagram(ntp(v4Src), 14+20+8), 40), okRule(pNTP)},
		{"udp4 padded to 60 bytes", padded(packet.Frame{Src: v4Src, Proto: packet.ProtoUDP, SrcPort: 123}.Build(), 18), okRule(pNTP)},
		{"tcp4 header cut by total length", padded(cutDatagram(packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, DstPort: 80}, 14+20+19), 30), dropped(maps.ReasonBadL4)},
		{"icmp4 header cut by total length", padded(cutDatagram(packet.Frame{Src: v4Src, Proto: packet.ProtoICMP, DstPort: 8}, 14+20+7), 30), dropped(maps.ReasonBadL4)},
		{"ipv4 first fragment, l4 cut by total length", padded(cutDatagram(frag(ntp(v4Src), 0, true), 14+20+4), 30), dropped(maps.ReasonBadL4)},
		{"ipv6 payload length past the frame by one", withIPLen(ntp(v6Src).Build(), 14, 40+8+48+1), dropped(maps.ReasonBadIPLen)},
		{"ipv6 payload length 65535", withIPLen(ntp(v6Src).Build(), 14, 40+65535), dropped(maps.ReasonBadIPLen)},
		{"ipv6 payload length 0: no l4 header", withIPLen(ntp(v6Src).Build(), 14, 40), dropped(maps.ReasonBadL4)},
		{"ipv6 payload length 0 with hop-by-hop (a jumbogram claim)", withIPLen(chain(v6Src, 0).Build(), 14, 40), dropped(maps.ReasonBadIPv6)},
		{"udp6 header cut by payload length, ports in the padding", padded(cutDatagram(ntp(v6Src), 14+40+4), 40), dropped(maps.ReasonBadL4)},
		{"udp6 exactly its header, padded", padded(cutDatagram(ntp(v6Src), 14+40+8), 40), okRule(pNTP)},
		{"ipv6 hop-by-hop cut by payload length", padded(cutDatagram(chain(v6Src, 0), 14+40+1), 40), dropped(maps.ReasonBadIPv6)},
		{"ipv6 long hop-by-hop cut by payload length", padded(cutDatagram(withLen(chain(v6Src, 0), 3), 14+40+31), 40), dropped(maps.ReasonBadIPv6)},
		{"ipv6 ah of 8 bytes (length 0)", with(chain(v6Src, 51).Build(), 14+40+1, 0), dropped(maps.ReasonBadIPv6)},
		{"ipv6 ah cut by payload length", padded(cutDatagram(chain(v6Src, 51), 14+40+11), 40), dropped(maps.ReasonBadIPv6)},
		{"ipv6 fragment header cut by payload length", padded(cutDatagram(frag(ntp(v6Src), 0, true), 14+40+7), 40), dropped(maps.ReasonBadIPv6)},
		{"ipv6 routing then udp cut by payload length", padded(cutDatagram(chain(v6Src, 43), 14+40+8+7), 40), dropped(maps.ReasonBadL4)},
		{"ipv6 chain of 6 ends at the payload length: udp header in the padding", padded(cutDatagram(chain(v6Src, 0, 43, 60, 51, 60, 60), 14+40+5*8+12), 40), dropped(maps.ReasonBadL4)},

		// ICMP under the wrong family.
		{"ipv4 protocol 58 (icmpv6)", withProto(packet.Frame{Src: v4Src, Proto: packet.ProtoICMP, DstPort: 8}, packet.ProtoICMPv6), dropped(maps.ReasonICMPFamily)},
		{"ipv4 protocol 58, non-first fragment", withProto(packet.Frame{Src: v4Src, Proto: packet.ProtoICMP, DstPort: 8, FragOffset: 3}, packet.ProtoICMPv6), dropped(maps.ReasonICMPFamily)},
		{"ipv6 next header 1 (icmp)", withProto(packet.Frame{Src: v6Src, Proto: packet.ProtoICMPv6, DstPort: 8}, packet.ProtoICMP), dropped(maps.ReasonICMPFamily)},
		{"ipv6 icmp after an extension chain", packet.Frame{Src: v6Src, Proto: packet.ProtoICMP, DstPort: 8, IPv6Ext: []uint8{0, 60}}.Build(), dropped(maps.ReasonICMPFamily)},
		{"ipv6 icmp after exactly 6 extension headers", packet.Frame{Src: v6Src, Proto: packet.ProtoICMP, DstPort: 8, IPv6Ext: []uint8{0, 43, 60, 51, 60, 60}}.Build(), dropped(maps.ReasonICMPFamily)},
		{"ipv6 icmp, non-first fragment", frag(packet.Frame{Src: v6Src, Proto: packet.ProtoICMP, DstPort: 8}, 5, false).Build(), dropped(maps.ReasonICMPFamily)},

		// TCP data offset.
		{"tcp data offset 4", withTCPDataOffset(packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, DstPort: 80}, 4), dropped(maps.ReasonBadL4)},
		{"tcp data offset 0", withTCPDataOffset(packet.Frame{Src: v6Src, Proto: packet.ProtoTCP, DstPort: 80}, 0), dropped(maps.ReasonBadL4)},
		{"tcp data offset 15, options past the datagram", withTCPDataOffset(packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, DstPort: 80, Payload: 39}, 15), dropped(maps.ReasonBadL4)},
		{"tcp data offset 15, options present", withTCPDataOffset(packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, DstPort: 80, Payload: 40}, 15), okRule(pWeb)},
		{"tcp6 data offset 6, options in the padding", padded(withIPLen(withTCPDataOffset(packet.Frame{Src: v6Src, Proto: packet.ProtoTCP, DstPort: 80, Payload: 4}, 6)[:14+40+20], 14, 40+20), 4), dropped(maps.ReasonBadL4)},

		// Tunnels, ESP, AH in IPv4, SCTP: not decapsulated, no ports;
		// limited by the outer source.
		{"ipip: source rule", withProto(ntp(v4Range), 4), okRule(pSrcRange)},
		{"6in4: source rule", withProto(ntp(v4Range), 41), okRule(pSrcRange)},
		{"ipv6 in ipv6", withProto(ntp(v6Range), 41), okRule(pSrcRange)},
		{"ipv4 in ipv6", withProto(ntp(v6Range), 4), okRule(pSrcRange)},
		{"esp4: source rule", withProto(ntp(v4Range), 50), okRule(pSrcRange)},
		{"esp6: source rule", withProto(ntp(v6Range), 50), okRule(pSrcRange)},
		{"ah in ipv4: not walked, no ports", withProto(ntp(v4Src), 51), okRule(pDefault)},
		{"sctp4 with port-shaped bytes: no port rule", withProto(ntp(v4Src), 132), okRule(pDefault)},
		{"sctp6: no port rule", withProto(ntp(v6Src), 132), okRule(pDefault)},
		{"gre with an inner udp header: no port rule", withProto(ntp(v4Src), protoGRE), okRule(pDefault)},

		// MPLS and PPPoE: not IP to the parser.
		{"mpls unicast", withEtherType(ntp(v4Src).Build(), 12, 0x8847), passed(maps.ReasonNonIP)},
		{"mpls multicast", withEtherType(ntp(v4Src).Build(), 12, 0x8848), passed(maps.ReasonNonIP)},
		{"pppoe session", withEtherType(ntp(v4Src).Build(), 12, 0x8864), passed(maps.ReasonNonIP)},
		{"pppoe discovery in a vlan", withEtherType(tagged(ntp(v4Src), 5).Build(), 16, 0x8863), passed(maps.ReasonNonIP)},
	}
}

func withEtherType(b []byte, off int, et uint16) []byte {
	binary.BigEndian.PutUint16(b[off:], et)
	return b
}

// TestParserTruncatedEverywhere cuts frames at every byte offset up to the
// end of their L4 header, three ways: the frame alone (the IP length then
// says more than the frame holds: bad_ip_length once the IP header is
// whole), the datagram (its length field set to the cut), and the datagram
// followed by padding that holds the rest of the original bytes. The last
// two must be counted under the reason of the header the cut falls in, and
// the whole frame must pass.
func TestParserTruncatedEverywhere(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(parsePolicy())
	td.setClock(0)
	c := newChecker(td)

	frames := []struct {
		name string
		f    packet.Frame
		full verdict
		noL4 bool // a non-first fragment: nothing after the IP headers is read
	}{
		{"udp4 qinq", packet.Frame{Src: v4Src, Proto: packet.ProtoUDP, SrcPort: 123, VLANs: []uint16{1, 2}}, okRule(pNTP), false},
		{"tcp4 options", packet.Frame{Src: v4Src, Proto: packet.ProtoTCP, DstPort: 80, IPv4Options: make([]byte, 12)}, okRule(pWeb), false},
		{"icmp4 8021q", packet.Frame{Src: v4Src, Proto: packet.ProtoICMP, DstPort: 8, VLANs: []uint16{7}}, okRule(pEcho), false},
		{"udp4 non-first fragment", packet.Frame{Src: v4Src, Proto: packet.ProtoUDP, FragOffset: 100}, okRule(pUDP), true},
		{"tcp6", packet.Frame{Src: v6Src, Proto: packet.ProtoTCP, DstPort: 80}, okRule(pWeb), false},
		{"udp6 qinq ext chain", packet.Frame{Src: v6Src, Proto: packet.ProtoUDP, SrcPort: 123, VLANs: []uint16{1, 2},
			IPv6Ext: []uint8{0, 43, 44, 51, 60}, IPv6ExtLen: []uint8{1, 0, 0, 2, 0}}, okRule(pNTP), false},
		{"icmp6 ah", packet.Frame{Src: v6Src, Proto: packet.ProtoICMPv6, DstPort: 128, IPv6Ext: []uint8{51}}, okRule(pEcho6), false},
		{"udp6 non-first fragment", packet.Frame{Src: v6Src, Proto: packet.ProtoUDP, FragOffset: 100, IPv6Ext: []uint8{0, 44}}, okRule(pUDP), true},
	}
	for _, fr := range frames {
		b := fr.f.Build()
		e := fr.f.Ends()
		ipBad := maps.ReasonBadIPv4
		if !fr.f.Src.Is4() {
			ipBad = maps.ReasonBadIPv6
		}
		end := e.L4
		if fr.noL4 {
			end = e.IP
			if len(e.Ext) > 0 {
				end = e.Ext[len(e.Ext)-1]
			}
		}
		// Shorter than an Ethernet header: the kernel refuses the run, so
		// bad_ethernet is only reachable from a driver (the reference
		// model's parser test covers it).
		for cut := 0; cut < minTestRunFrame; cut++ {
			_, err := td.d.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: b[:cut]})
			if !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("%s cut at %d: prog test run error %v, want EINVAL", fr.name, cut, err)
			}
		}
		for cut := minTestRunFrame; cut <= end; cut++ {
			var want verdict
			switch {
			case len(e.VLAN) > 0 && cut < e.VLAN[len(e.VLAN)-1]:
				want = dropped(maps.ReasonBadVLAN)
			case cut < e.IP:
				want = dropped(ipBad)
			case cut < len(b):
				want = dropped(maps.ReasonBadIPLen)
			default:
				want = fr.full
			}
			name := fr.name + " cut at " + itoa(uint32(cut))
			c.send(name, b[:cut], want)
			if cut < e.IP {
				continue
			}
			switch {
			case len(e.Ext) > 0 && cut < e.Ext[len(e.Ext)-1]:
				want = dropped(maps.ReasonBadIPv6)
			case cut < end:
				want = dropped(maps.ReasonBadL4)
			default:
				want = fr.full
			}
			dg := cutDatagram(fr.f, cut)
			c.send(name+" (datagram)", dg, want)
			c.send(name+" (datagram, padded)", append(dg, b[cut:]...), want)
		}
	}
}

// TestIPv6ChainOfExactlyMaxExtKeepsPorts: a packet with exactly
// EG_MAX_IPV6_EXT (6) extension headers has its L4 header right after the
// last one; it keeps its ports and matches port rules (here: udp source
// port 123). Only chains longer than the bound lose L4 fields.
func TestIPv6ChainOfExactlyMaxExtKeepsPorts(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(parsePolicy())
	c := newChecker(td)
	f := ntp(v6Src)
	f.IPv6Ext = []uint8{0, 43, 60, 51, 60, 60}
	c.send("ipv6 chain of exactly 6", f.Build(), okRule(pNTP))
}
