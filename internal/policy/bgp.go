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
	FlowSpec     bool
	FlowSpecRate Rate // bytes
	Neighbors    []BGPNeighbor
	Pos          Pos
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

func (ps *parser) bgp(n *yaml.Node) *BGP {
	f := ps.Fields(n, "bgp", "local_as", "router_id", "dry_run", "community", "max_announcements", "widths", "forbid",
		"destinations", "uplink", "blackhole", "flowspec", "neighbors")
	if f == nil {
		return nil
	}
	b := &BGP{DryRun: true, Community: DefaultBGPCommunity, MaxAnnouncements: DefaultBGPMax, Width4: 32, Width6: 128,
		BlackholeTTL: DefaultBGPBlackholeTT, FlowSpec: true, Pos: yamlcheck.PosOf(n)}
	if v, ok := f["local_as"]; !ok {
		ps.Errorf(n, "bgp needs local_as (this host's AS number)")
	} else {
		b.LocalAS = ps.asNumber(v, "bgp.local_as")
	}
	if v, ok := f["router_id"]; !ok {
		ps.Errorf(n, "bgp needs router_id (an IPv4 address unique among the peers' neighbors)")
	} else if s, ok := ps.Scalar(v, "bgp.router_id"); ok {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() || a.IsUnspecified() {
			ps.Errorf(v, "bgp.router_id %q: want an IPv4 address other than 0.0.0.0", s)
		} else {
			b.RouterID = a
		}
	}
	if v, ok := f["dry_run"]; ok {
		b.DryRun = ps.boolean(v, "bgp.dry_run", b.DryRun)
	}
	if v, ok := f["community"]; ok {
		if s, ok := ps.Scalar(v, "bgp.community"); ok {
			if c, err := ParseCommunity(s); err != nil {
				ps.Errorf(v, "bgp.community: %v", err)
			} else {
				b.Community = c
			}
		}
	}
	if v, ok := f["max_announcements"]; ok {
		if m, ok := ps.UintIn(v, "bgp.max_announcements", 1, maxBGPAnnouncements); ok {
			b.MaxAnnouncements = int(m)
		}
	}
	if v, ok := f["widths"]; ok {
		wf := ps.Fields(v, "bgp.widths", "ipv4", "ipv6")
		if x, ok := wf["ipv4"]; ok {
			if m, ok := ps.UintIn(x, "bgp.widths.ipv4", 8, 32); ok {
				b.Width4 = int(m)
			}
		}
		if x, ok := wf["ipv6"]; ok {
			if m, ok := ps.UintIn(x, "bgp.widths.ipv6", 16, 128); ok {
				b.Width6 = int(m)
			}
		}
	}
	if v, ok := f["forbid"]; ok {
		b.Forbid = ps.bgpPrefixes(v, "bgp.forbid", 0, 0)
	}
	if v, ok := f["destinations"]; ok {
		b.Destinations = ps.bgpPrefixes(v, "bgp.destinations", b.Width4, b.Width6)
	}
	if v, ok := f["uplink"]; ok {
		uf := ps.Fields(v, "bgp.uplink", "rate", "fraction")
		b.Fraction = 0.8
		if x, ok := uf["rate"]; !ok {
			ps.Errorf(v, "bgp.uplink needs rate (the line rate, like 10Gbit/s)")
		} else {
			b.Uplink = ps.byteRate(x, "bgp.uplink.rate")
		}
		if x, ok := uf["fraction"]; ok {
			b.Fraction = ps.percent(x, "bgp.uplink.fraction", 0.01, 1, b.Fraction)
		}
	}
	if v, ok := f["blackhole"]; ok {
		hf := ps.Fields(v, "bgp.blackhole", "ttl")
		if x, ok := hf["ttl"]; ok {
			b.BlackholeTTL = ps.duration(x, "bgp.blackhole.ttl", 10*time.Second, 7*24*time.Hour, b.BlackholeTTL)
		}
	}
	if v, ok := f["flowspec"]; ok {
		ff := ps.Fields(v, "bgp.flowspec", "auto", "action", "rate")
		if x, ok := ff["auto"]; ok {
			b.FlowSpec = ps.boolean(x, "bgp.flowspec.auto", b.FlowSpec)
		}
		action := "discard"
		if x, ok := ff["action"]; ok {
			action = ps.enum(x, "bgp.flowspec.action", action, "discard", "rate")
		}
		x, hasRate := ff["rate"]
		switch {
		case action == "rate" && !hasRate:
			ps.Errorf(v, "bgp.flowspec: action rate needs rate (bytes or bits per second, like 1MB/s)")
		case action == "discard" && hasRate:
			ps.Errorf(x, "bgp.flowspec.rate is for action: rate (discard drops everything the rule matches)")
		case hasRate:
			b.FlowSpecRate = ps.byteRate(x, "bgp.flowspec.rate")
		}
	}
	if v, ok := f["neighbors"]; !ok {
		ps.Errorf(n, "bgp needs neighbors (at least one: address, as)")
	} else {
		items := ps.Seq(v, "bgp.neighbors")
		if len(items) == 0 || len(items) > maxBGPNeighbors {
			ps.Errorf(v, "bgp.neighbors: %d neighbors, want 1 to %d", len(items), maxBGPNeighbors)
		}
		seen := map[netip.Addr]bool{}
		for _, item := range items {
			nb := ps.bgpNeighbor(item)
			if nb.Address.IsValid() && seen[nb.Address] {
				ps.Errorf(item, "bgp.neighbors: %s twice", nb.Address)
			}
			seen[nb.Address] = true
			b.Neighbors = append(b.Neighbors, nb)
		}
	}
	if len(b.Destinations) == 0 && (b.FlowSpec || b.Uplink.Count != 0) {
		if _, ok := f["destinations"]; !ok {
			ps.Errorf(n, "bgp needs destinations (this host's addresses, like 198.51.100.10/32) for flowspec.auto and uplink; or set flowspec: {auto: false} and no uplink")
		}
	}
	return b
}

// asNumber is a 32-bit AS number, not 0 (reserved, RFC 7607) nor 23456
// (AS_TRANS, RFC 6793).
func (ps *parser) asNumber(n *yaml.Node, where string) uint32 {
	v, ok := ps.UintIn(n, where, 1, 1<<32-1)
	if !ok {
		return 0
	}
	if v == 23456 {
		ps.Errorf(n, "%s 23456 is AS_TRANS (RFC 6793), not an AS", where)
		return 0
	}
	return uint32(v)
}

// bgpPrefixes is a list of prefixes (no host bits); with w4/w6 set, none
// wider than those.
func (ps *parser) bgpPrefixes(n *yaml.Node, where string, w4, w6 int) []netip.Prefix {
	items := ps.Seq(n, where)
	if len(items) > maxBGPPrefixes {
		ps.Errorf(n, "%s: %d prefixes, at most %d", where, len(items), maxBGPPrefixes)
		return nil
	}
	var out []netip.Prefix
	for _, item := range items {
		s, ok := ps.Scalar(item, where)
		if !ok {
			continue
		}
		p, err := ParsePrefix(s)
		if err != nil {
			ps.Errorf(item, "%s: %v", where, err)
			continue
		}
		if p.Addr().Is4In6() {
			ps.Errorf(item, "%s: %s is an IPv4-mapped IPv6 prefix: write the IPv4 prefix", where, s)
			continue
		}
		if w4 > 0 && (p.Addr().Is4() && p.Bits() < w4 || p.Addr().Is6() && p.Bits() < w6) {
			ps.Errorf(item, "%s: %s is wider than bgp.widths allows (/%d IPv4, /%d IPv6)", where, p, w4, w6)
			continue
		}
		if slices.Contains(out, p) {
			ps.Errorf(item, "%s: %s twice", where, p)
			continue
		}
		out = append(out, p)
	}
	return out
}

// byteRate is a bit or byte rate (packets are refused).
func (ps *parser) byteRate(n *yaml.Node, where string) Rate {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return Rate{}
	}
	r, u, err := ParseRate(s)
	switch {
	case err != nil:
		ps.Errorf(n, "%s: %v", where, err)
	case u != Bytes:
		ps.Errorf(n, "%s %q: want bits or bytes per time, like 10Gbit/s or 1MB/s", where, s)
	case r.PerSecond() < 1 || r.PerSecond() > 1e13:
		ps.Errorf(n, "%s %q: want 8bit/s to 80Tbit/s", where, s)
	default:
		return r
	}
	return Rate{}
}

func (ps *parser) bgpNeighbor(n *yaml.Node) BGPNeighbor {
	nb := BGPNeighbor{Multihop: 1, Pos: yamlcheck.PosOf(n)}
	f := ps.Fields(n, "bgp neighbor", "address", "as", "password_file", "multihop", "local_address", "families")
	if f == nil {
		return nb
	}
	addr := func(key string) netip.Addr {
		v, ok := f[key]
		if !ok {
			return netip.Addr{}
		}
		s, ok := ps.Scalar(v, "bgp neighbor "+key)
		if !ok {
			return netip.Addr{}
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
			ps.Errorf(v, "bgp neighbor %s %q: want a unicast IPv4 or IPv6 address", key, s)
			return netip.Addr{}
		}
		return a
	}
	if _, ok := f["address"]; !ok {
		ps.Errorf(n, "bgp neighbor needs address")
	}
	nb.Address = addr("address")
	nb.LocalAddress = addr("local_address")
	if nb.LocalAddress.IsValid() && nb.Address.IsValid() && nb.LocalAddress.Is4() != nb.Address.Is4() {
		ps.Errorf(f["local_address"], "bgp neighbor local_address %s and address %s are of different families", nb.LocalAddress, nb.Address)
	}
	if v, ok := f["as"]; !ok {
		ps.Errorf(n, "bgp neighbor needs as (the peer's AS number)")
	} else {
		nb.AS = ps.asNumber(v, "bgp neighbor as")
	}
	if v, ok := f["password_file"]; ok {
		nb.PasswordFile, _ = yamlcheck.Path{}.Parse(&ps.Checker, v, "bgp neighbor password_file")
	}
	if v, ok := f["multihop"]; ok {
		if m, ok := ps.UintIn(v, "bgp neighbor multihop", 1, 255); ok {
			nb.Multihop = uint8(m)
		}
	}
	if v, ok := f["families"]; ok {
		items := ps.Seq(v, "bgp neighbor families")
		if len(items) == 0 {
			ps.Errorf(v, "bgp neighbor families: empty; allowed: %s", strings.Join(BGPFamilies, ", "))
		}
		for _, item := range items {
			fam := ps.enum(item, "bgp neighbor family", "", BGPFamilies...)
			if fam == "" {
				continue
			}
			if slices.Contains(nb.Families, fam) {
				ps.Errorf(item, "bgp neighbor families: %s twice", fam)
				continue
			}
			nb.Families = append(nb.Families, fam)
		}
	} else if nb.Address.Is6() {
		nb.Families = []string{"ipv6-unicast", "ipv6-flowspec"}
	} else {
		nb.Families = []string{"ipv4-unicast", "ipv4-flowspec"}
	}
	return nb
}

// bgp reports a changed bgp: section, one line.
func (d *differ) bgp(a, b *BGP) {
	switch {
	case a == nil && b == nil:
	case a == nil:
		d.add('+', "bgp section: %s", bgpSummary(b))
	case b == nil:
		d.add('-', "bgp section (sessions closed: the peers withdraw every announcement)")
	default:
		d.field("bgp", bgpSummary(a), bgpSummary(b))
	}
}

func bgpSummary(b *BGP) string {
	var nbs []string
	for _, n := range b.Neighbors {
		s := fmt.Sprintf("%s AS%d %s", n.Address, n.AS, strings.Join(n.Families, "+"))
		if n.Multihop > 1 {
			s += fmt.Sprintf(" multihop %d", n.Multihop)
		}
		if n.PasswordFile != "" {
			s += " password " + n.PasswordFile
		}
		nbs = append(nbs, s)
	}
	str := func(ps []netip.Prefix) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.String())
		}
		return "[" + strings.Join(out, ", ") + "]"
	}
	s := fmt.Sprintf("AS%d router %s dry_run %t community %d:%d max %d widths /%d /%d destinations %s forbid %s",
		b.LocalAS, b.RouterID, b.DryRun, b.Community>>16, b.Community&0xffff, b.MaxAnnouncements, b.Width4, b.Width6,
		str(b.Destinations), str(b.Forbid))
	if !b.Uplink.IsZero() {
		s += fmt.Sprintf(" uplink %s x %g", FormatRate(b.Uplink, Bytes), b.Fraction)
	}
	s += fmt.Sprintf(" blackhole ttl %s flowspec %t", b.BlackholeTTL, b.FlowSpec)
	if !b.FlowSpecRate.IsZero() {
		s += " rate " + FormatRate(b.FlowSpecRate, Bytes)
	}
	return s + " neighbors " + strings.Join(nbs, "; ")
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
