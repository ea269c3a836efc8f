package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// BGP is the bgp: section: the BGP speaker that asks upstream routers
// for blackhole routes (RTBH) and FlowSpec rules (docs/bgp.md). Nil
// without one: no sessions.
type BGP struct {
	LocalAS  uint32
	RouterID netip.Addr
	// DryRun logs and lists what would be announced, announces nothing
	// (the default).
	DryRun bool
	// Community tags blackhole routes: ASN<<16 | value (65535:666).
	Community        uint32
	MaxAnnouncements int
	// Width4 and Width6 are the widest prefix lengths announced (a
	// blackhole, a FlowSpec destination): 32 and 128 unless widened.
	Width4, Width6 int
	// Forbid are prefixes never announced nor matched (lists.allow and
	// lists.protected are refused too).
	Forbid []netip.Prefix
	// Destinations are this host's addresses: the destination of FlowSpec
	// rules and of the automatic blackhole.
	Destinations []netip.Prefix
	// Uplink, if set, is the host's line rate (bytes): the automatic
	// blackhole is announced while the offered rate is above
	// Uplink x Fraction.
	Uplink   Rate
	Fraction float64
	// BlackholeTTL is the automatic blackhole's lifetime, renewed while
	// the rate stays above; also edgectl bgp blackhole's default.
	BlackholeTTL time.Duration
	// FlowSpec: announce the shield's enforced fingerprints as FlowSpec
	// rules, with action discard (FlowSpecRate zero) or traffic-rate.
	FlowSpec bool
	// FlowSpecAction is bgp.flowspec.action: discard (FlowSpecRate zero)
	// or rate.
	FlowSpecAction string
	FlowSpecRate   Rate // bytes
	Neighbors      []BGPNeighbor
	Pos            Pos
}

// BGPNeighbor is one bgp.neighbors entry.
type BGPNeighbor struct {
	Address netip.Addr
	AS      uint32
	// PasswordFile holds the TCP MD5 secret (the secret is not in the
	// policy); empty: none.
	PasswordFile string
	Multihop     uint8
	LocalAddress netip.Addr
	Families     []string
	Pos          Pos
}

// BGP defaults and bounds.
const (
	DefaultBGPCommunity   = 65535<<16 | 666 // RFC 7999 BLACKHOLE
	DefaultBGPMax         = 16
	DefaultBGPBlackholeTT = 10 * time.Minute
	maxBGPAnnouncements   = 1024
	maxBGPNeighbors       = 16
	maxBGPPrefixes        = 1024
)

// BGPFamilies are the address families a neighbor may carry.
var BGPFamilies = []string{"ipv4-unicast", "ipv6-unicast", "ipv4-flowspec", "ipv6-flowspec"}

// ParseCommunity reads a standard community, "65535:666".
func ParseCommunity(s string) (uint32, error) {
	a, b, ok := strings.Cut(s, ":")
	x, err1 := strconv.ParseUint(a, 10, 16)
	y, err2 := strconv.ParseUint(b, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("community %q: want ASN:VALUE, each 0-65535, like 65535:666", s)
	}
	return uint32(x)<<16 | uint32(y), nil
}

// bgpTable is the bgp: section (docs/bgp.md).
var bgpTable = yamlcheck.NewTable("bgp",
	yamlcheck.Val[BGP, uint32]("local_as", asNumber{}, func(b *BGP) *uint32 { return &b.LocalAS }, "this host's AS number").
		Required("bgp needs local_as (this host's AS number)"),
	yamlcheck.Val[BGP, netip.Addr]("router_id", routerID, func(b *BGP) *netip.Addr { return &b.RouterID },
		"an IPv4 address unique among the peers' neighbors").
		Required("bgp needs router_id (an IPv4 address unique among the peers' neighbors)"),
	yamlcheck.Val("dry_run", yamlcheck.Bool{}, func(b *BGP) *bool { return &b.DryRun },
		"log and list what would be announced, announce nothing"),
	yamlcheck.Val[BGP, uint32]("community", community, func(b *BGP) *uint32 { return &b.Community },
		"the community of blackhole routes (RFC 7999 BLACKHOLE by default)"),
	yamlcheck.Val("max_announcements", yamlcheck.Uint[int]{Min: 1, Max: maxBGPAnnouncements},
		func(b *BGP) *int { return &b.MaxAnnouncements }, "the most routes announced at once"),
	yamlcheck.Sub("widths", "the widest prefix lengths announced (a blackhole, a FlowSpec destination)",
		yamlcheck.Val("ipv4", yamlcheck.Uint[int]{Min: 8, Max: 32}, func(b *BGP) *int { return &b.Width4 }, "IPv4"),
		yamlcheck.Val("ipv6", yamlcheck.Uint[int]{Min: 16, Max: 128}, func(b *BGP) *int { return &b.Width6 }, "IPv6"),
	),
	yamlcheck.Val[BGP, []netip.Prefix]("forbid", bgpPrefixes{}, func(b *BGP) *[]netip.Prefix { return &b.Forbid },
		"prefixes never announced nor matched (lists.allow and lists.protected are refused too)"),
	yamlcheck.Val[BGP, []netip.Prefix]("destinations", bgpPrefixes{}, func(b *BGP) *[]netip.Prefix { return &b.Destinations },
		"this host's addresses: the destination of FlowSpec rules and of the automatic blackhole (no wider than widths)"),
	yamlcheck.Sub("uplink", "the automatic blackhole: announced while the offered rate is above rate × fraction",
		yamlcheck.Val[BGP, Rate]("rate", byteRate, func(b *BGP) *Rate { return &b.Uplink }, "the host's line rate").
			Required("bgp.uplink needs rate (the line rate, like 10Gbit/s)"),
		yamlcheck.Val("fraction", yamlcheck.Percent{Min: 0.01, Max: 1}, func(b *BGP) *float64 { return &b.Fraction },
			"the share of the line rate above which the blackhole is announced"),
	),
	yamlcheck.Sub("blackhole", "blackhole routes",
		yamlcheck.Val("ttl", yamlcheck.Duration{Min: 10 * time.Second, Max: 7 * 24 * time.Hour},
			func(b *BGP) *time.Duration { return &b.BlackholeTTL },
			"the automatic blackhole's lifetime, renewed while the rate stays above; edgectl bgp blackhole's default"),
	),
	yamlcheck.Sub("flowspec", "announce the shield's enforced fingerprints as FlowSpec rules",
		yamlcheck.Val("auto", yamlcheck.Bool{}, func(b *BGP) *bool { return &b.FlowSpec }, "whether to announce them"),
		yamlcheck.Val("action", yamlcheck.Enum[string]{Values: []string{"discard", "rate"}},
			func(b *BGP) *string { return &b.FlowSpecAction }, "discard, or rate (traffic-rate)"),
		yamlcheck.Val[BGP, Rate]("rate", byteRate, func(b *BGP) *Rate { return &b.FlowSpecRate }, "action rate's rate"),
	),
	yamlcheck.Val[BGP, []BGPNeighbor]("neighbors", bgpNeighbors{}, func(b *BGP) *[]BGPNeighbor { return &b.Neighbors },
		"the peers: {address, as, password_file, multihop, local_address, families} (bgp neighbor below)").
		Required("bgp needs neighbors (at least one: address, as)"),
)

// bgpNeighborTable is one bgp.neighbors entry.
var bgpNeighborTable = yamlcheck.NewTable("bgp neighbor",
	yamlcheck.Val[BGPNeighbor, netip.Addr]("address", unicastAddr, func(n *BGPNeighbor) *netip.Addr { return &n.Address }, "the peer's address").
		Required("bgp neighbor needs address"),
	yamlcheck.Val[BGPNeighbor, uint32]("as", asNumber{}, func(n *BGPNeighbor) *uint32 { return &n.AS }, "the peer's AS number").
		Required("bgp neighbor needs as (the peer's AS number)"),
	yamlcheck.Val("password_file", yamlcheck.Path{}, func(n *BGPNeighbor) *string { return &n.PasswordFile },
		"a file holding the TCP MD5 secret"),
	yamlcheck.Val("multihop", yamlcheck.Uint[uint8]{Min: 1, Max: 255}, func(n *BGPNeighbor) *uint8 { return &n.Multihop }, "the session's TTL"),
	yamlcheck.Val[BGPNeighbor, netip.Addr]("local_address", unicastAddr, func(n *BGPNeighbor) *netip.Addr { return &n.LocalAddress },
		"the source address of the session (the address's family)"),
	yamlcheck.Val[BGPNeighbor, []string]("families", bgpFamilies{}, func(n *BGPNeighbor) *[]string { return &n.Families },
		"address families; by default unicast and flowspec of the address's family"),
)

func (ps *parser) bgp(n *yaml.Node) *BGP {
	b := defaultBGP()
	b.Pos = yamlcheck.PosOf(n)
	f := bgpTable.Parse(&ps.Checker, n, b)
	if f == nil {
		return nil
	}
	if _, ok := f["uplink"]; !ok {
		b.Fraction = 0
	}
	if v, ok := f["destinations"]; ok {
		for _, item := range yamlcheck.Seq(v) {
			p, err := ParsePrefix(item.Value)
			if err == nil && (p.Addr().Is4() && p.Bits() < b.Width4 || p.Addr().Is6() && p.Bits() < b.Width6) {
				ps.Errorf(item, "bgp.destinations: %s is wider than bgp.widths allows (/%d IPv4, /%d IPv6)", p, b.Width4, b.Width6)
				b.Destinations = slices.DeleteFunc(b.Destinations, func(q netip.Prefix) bool { return q == p })
			}
		}
	}
	if v, ok := f["flowspec"]; ok {
		x := yamlcheck.Lookup(v, "rate")
		switch {
		case b.FlowSpecAction == "rate" && x == nil:
			ps.Errorf(v, "bgp.flowspec: action rate needs rate (bytes or bits per second, like 1MB/s)")
		case b.FlowSpecAction == "discard" && x != nil:
			ps.Errorf(x, "bgp.flowspec.rate is for action: rate (discard drops everything the rule matches)")
			b.FlowSpecRate = Rate{}
		}
	}
	if len(b.Destinations) == 0 && (b.FlowSpec || b.Uplink.Count != 0) {
		if _, ok := f["destinations"]; !ok {
			ps.Errorf(n, "bgp needs destinations (this host's addresses, like 198.51.100.10/32) for flowspec.auto and uplink; or set flowspec: {auto: false} and no uplink")
		}
	}
	return b
}

// defaultBGP is what each field of a bgp: section defaults to
// (uplink.fraction applies only with an uplink).
func defaultBGP() *BGP {
	return &BGP{DryRun: true, Community: DefaultBGPCommunity, MaxAnnouncements: DefaultBGPMax, Width4: 32, Width6: 128,
		BlackholeTTL: DefaultBGPBlackholeTT, FlowSpec: true, FlowSpecAction: "discard", Fraction: 0.8}
}

// asNumber is a 32-bit AS number, not 0 (reserved, RFC 7607) nor 23456
// (AS_TRANS, RFC 6793).
type asNumber struct{}

func (asNumber) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (uint32, bool) {
	v, ok := c.UintIn(n, where, 1, 1<<32-1)
	if !ok {
		return 0, false
	}
	if v == 23456 {
		c.Errorf(n, "%s 23456 is AS_TRANS (RFC 6793), not an AS", where)
		return 0, false
	}
	return uint32(v), true
}

func (asNumber) Format(v uint32) string { return fmt.Sprintf("AS%d", v) }

func (asNumber) Describe() string { return "AS number, 1 to 4294967295 (not 23456)" }

// routerID is an IPv4 address other than 0.0.0.0.
var routerID = yamlcheck.Parsed[netip.Addr]{
	Func: func(s string) (netip.Addr, error) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() || a.IsUnspecified() {
			return netip.Addr{}, fmt.Errorf("%q: want an IPv4 address other than 0.0.0.0", s)
		}
		return a, nil
	},
	Fmt: formatAddr, Desc: "IPv4 address",
}

// unicastAddr is a unicast IPv4 or IPv6 address.
var unicastAddr = yamlcheck.Parsed[netip.Addr]{
	Func: func(s string) (netip.Addr, error) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
			return netip.Addr{}, fmt.Errorf("%q: want a unicast IPv4 or IPv6 address", s)
		}
		return a, nil
	},
	Fmt:  formatAddr,
	Desc: "unicast IPv4 or IPv6 address",
}

func formatAddr(a netip.Addr) string {
	if !a.IsValid() {
		return "none"
	}
	return a.String()
}

// community is ASN:VALUE.
var community = yamlcheck.Parsed[uint32]{Func: ParseCommunity, Fmt: func(v uint32) string { return fmt.Sprintf("%d:%d", v>>16, v&0xffff) },
	Desc: "ASN:VALUE, each 0-65535"}

// bgpPrefixes is a list of prefixes (no host bits, no IPv4-mapped IPv6),
// each once.
type bgpPrefixes struct{}

func (bgpPrefixes) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]netip.Prefix, bool) {
	items := c.Seq(n, where)
	if len(items) > maxBGPPrefixes {
		c.Errorf(n, "%s: %d prefixes, at most %d", where, len(items), maxBGPPrefixes)
		return nil, false
	}
	var out []netip.Prefix
	for _, item := range items {
		p, ok := prefixAt(c, item, where, where)
		if !ok {
			continue
		}
		if p.Addr().Is4In6() {
			c.Errorf(item, "%s: %s is an IPv4-mapped IPv6 prefix: write the IPv4 prefix", where, item.Value)
			continue
		}
		if slices.Contains(out, p) {
			c.Errorf(item, "%s: %s twice", where, p)
			continue
		}
		out = append(out, p)
	}
	return out, true
}

func (k bgpPrefixes) Format(ps []netip.Prefix) string {
	return "[" + strings.Join(k.Items(ps), ", ") + "]"
}

func (bgpPrefixes) Items(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func (bgpPrefixes) Describe() string { return fmt.Sprintf("list of CIDRs, at most %d", maxBGPPrefixes) }

// byteRate is a bit or byte rate from 8bit/s to 80Tbit/s (packets are
// refused).
var byteRate = rateKind{Unit: Bytes, Min: 1, Max: 1e13, Range: "8bit/s to 80Tbit/s"}

// bgpNeighbors is bgp.neighbors: 1 to maxBGPNeighbors entries
// (bgpNeighborTable), each address once.
type bgpNeighbors struct{}

func (bgpNeighbors) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]BGPNeighbor, bool) {
	items := c.Seq(n, where)
	if len(items) == 0 || len(items) > maxBGPNeighbors {
		c.Errorf(n, "%s: %d neighbors, want 1 to %d", where, len(items), maxBGPNeighbors)
	}
	var out []BGPNeighbor
	seen := map[netip.Addr]bool{}
	for _, item := range items {
		nb := BGPNeighbor{Multihop: 1, Pos: yamlcheck.PosOf(item)} // the defaults
		f := bgpNeighborTable.ParseItem(c, item, "bgp neighbor", &nb)
		if f != nil {
			if nb.LocalAddress.IsValid() && nb.Address.IsValid() && nb.LocalAddress.Is4() != nb.Address.Is4() {
				c.Errorf(f["local_address"], "bgp neighbor local_address %s and address %s are of different families", nb.LocalAddress, nb.Address)
			}
			if _, ok := f["families"]; !ok {
				nb.Families = []string{"ipv4-unicast", "ipv4-flowspec"}
				if nb.Address.Is6() {
					nb.Families = []string{"ipv6-unicast", "ipv6-flowspec"}
				}
			}
		}
		if nb.Address.IsValid() && seen[nb.Address] {
			c.Errorf(item, "%s: %s twice", where, nb.Address)
		}
		seen[nb.Address] = true
		out = append(out, nb)
	}
	return out, true
}

func (k bgpNeighbors) Format(nbs []BGPNeighbor) string {
	return "[" + strings.Join(k.Items(nbs), "; ") + "]"
}

func (bgpNeighbors) Items(nbs []BGPNeighbor) []string {
	out := make([]string, len(nbs))
	for i := range nbs {
		out[i] = bgpNeighborTable.String(&nbs[i])
	}
	return out
}

func (bgpNeighbors) Describe() string {
	return fmt.Sprintf("list of 1 to %d neighbors", maxBGPNeighbors)
}

// bgpFamilies is a neighbor's address families, each once.
type bgpFamilies struct{}

func (bgpFamilies) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]string, bool) {
	items := c.Seq(n, where)
	if len(items) == 0 {
		c.Errorf(n, "%s: empty; allowed: %s", where, strings.Join(BGPFamilies, ", "))
		return nil, false
	}
	var out []string
	for _, item := range items {
		fam, ok := yamlcheck.Enum[string]{Values: BGPFamilies}.Parse(c, item, "bgp neighbor family")
		if !ok {
			continue
		}
		if slices.Contains(out, fam) {
			c.Errorf(item, "%s: %s twice", where, fam)
			continue
		}
		out = append(out, fam)
	}
	return out, true
}

func (bgpFamilies) Format(f []string) string { return strings.Join(f, "+") }

func (bgpFamilies) Describe() string { return "list of " + strings.Join(BGPFamilies, ", ") }

// bgp reports a changed bgp: section: its presence, and each knob that
// changed.
func (d *differ) bgp(a, b *BGP) {
	switch {
	case a == nil && b == nil:
	case a == nil:
		d.add('+', "bgp section: %s", bgpTable.String(b))
	case b == nil:
		d.add('-', "bgp section (sessions closed: the peers withdraw every announcement)")
	default:
		bgpTable.DiffWith("bgp ", a, b, d.emit)
	}
}

// BGPGuard is a prefix the speaker never announces nor matches, and the
// policy field it comes from.
type BGPGuard struct {
	Prefix netip.Prefix
	Why    string
}

// BGPGuarded are the guard's prefixes: bgp.forbid, lists.allow and
// lists.protected.
func (p *Policy) BGPGuarded() []BGPGuard {
	var out []BGPGuard
	if p.BGP != nil {
		for _, q := range p.BGP.Forbid {
			out = append(out, BGPGuard{q, "bgp.forbid"})
		}
	}
	for _, e := range p.Allow {
		out = append(out, BGPGuard{e.Prefix, "lists.allow"})
	}
	for _, e := range p.Protected {
		out = append(out, BGPGuard{e.Prefix, "lists.protected"})
	}
	return out
}

// checkBGP refuses destinations the guards would refuse anyway.
func (ps *parser) checkBGP(p *Policy) {
	if p.BGP == nil {
		return
	}
	for _, d := range p.BGP.Destinations {
		for _, g := range p.BGPGuarded() {
			if d.Overlaps(g.Prefix) {
				ps.Errorf(&yaml.Node{Line: p.BGP.Pos.Line, Column: p.BGP.Pos.Column},
					"bgp.destinations: %s overlaps %s (%s): the speaker never announces it", d, g.Prefix, g.Why)
			}
		}
	}
}
