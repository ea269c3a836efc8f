package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// A rule's match: one row per form. The walker whitelists the keys and
// parses each list's items at their positions; what crosses fields runs
// after the walk (matchChecks): exactly one form, ports and ICMP types only
// with a protocol that has them, and each prefix, ASN, country and L4 key
// claimed by one rule only.

// matchItem is one parsed item of a match list and where it was written
// (for the claim).
type matchItem[V any] struct {
	V V
	n *yaml.Node
}

// matchSpec is a match as the walker parses it.
type matchSpec struct {
	Prefixes  []matchItem[netip.Prefix]
	ASNs      []matchItem[uint32]
	Countries []matchItem[Country]
	Protocol  string
	SrcPorts  []matchItem[uint16]
	DstPorts  []matchItem[uint16]
	ICMPTypes []matchItem[uint16]
}

// itemList is a match list of Item values: each item parsed by parse,
// named as "<rule> match <Item>" in messages.
type itemList[V any] struct {
	Key, Item, Desc string
	parse           func(c *yamlcheck.Checker, n *yaml.Node, where, s string) (V, bool)
	format          func(V) string
}

func (k itemList[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]matchItem[V], bool) {
	base := strings.TrimSuffix(where, " "+k.Key)
	var out []matchItem[V]
	for _, it := range c.Seq(n, where) {
		if v, ok := k.parse(c, it, base, base+" "+k.Item); ok {
			out = append(out, matchItem[V]{v, it})
		}
	}
	return out, true
}

func (k itemList[V]) Format(items []matchItem[V]) string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = k.format(it.V)
	}
	return strings.Join(out, ", ")
}

func (k itemList[V]) Describe() string { return k.Desc }

// scalarItem parses an item with parse, reporting its error as "<rule>
// match: err".
func scalarItem[V any](parse func(string) (V, error)) func(c *yamlcheck.Checker, n *yaml.Node, base, where string) (V, bool) {
	return func(c *yamlcheck.Checker, n *yaml.Node, base, where string) (V, bool) {
		var zero V
		s, ok := c.Scalar(n, where)
		if !ok {
			return zero, false
		}
		v, err := parse(s)
		if err != nil {
			c.Errorf(n, "%s: %v", base, err)
			return zero, false
		}
		return v, true
	}
}

// numberItem is a whole number from lo to hi.
func numberItem(lo, hi uint64) func(c *yamlcheck.Checker, n *yaml.Node, base, where string) (uint16, bool) {
	return func(c *yamlcheck.Checker, n *yaml.Node, _, where string) (uint16, bool) {
		u, ok := c.UintIn(n, where, lo, hi)
		return uint16(u), ok
	}
}

func portList(key string) itemList[uint16] {
	return itemList[uint16]{Key: key, Item: "port", Desc: "list of ports, 1 to 65535", parse: numberItem(1, 65535),
		format: func(p uint16) string { return strconv.Itoa(int(p)) }}
}

var matchTable = yamlcheck.NewTable("match",
	yamlcheck.Val[matchSpec, []matchItem[netip.Prefix]]("prefixes", itemList[netip.Prefix]{Key: "prefixes", Item: "prefix",
		Desc: "list of CIDRs", parse: scalarItem(ParsePrefix), format: netip.Prefix.String},
		func(m *matchSpec) *[]matchItem[netip.Prefix] { return &m.Prefixes }, "sources in these prefixes (the most specific rule wins)"),
	yamlcheck.Val[matchSpec, []matchItem[uint32]]("asns", itemList[uint32]{Key: "asns", Item: "asn",
		Desc: "list of ASNs (64500, AS64500), 1 to 4294967295", parse: scalarItem(ParseASN),
		format: func(a uint32) string { return "AS" + strconv.FormatUint(uint64(a), 10) }},
		func(m *matchSpec) *[]matchItem[uint32] { return &m.ASNs }, "sources originated by these ASNs (needs asn_data)"),
	yamlcheck.Val[matchSpec, []matchItem[Country]]("countries", itemList[Country]{Key: "countries", Item: "country",
		Desc: "list of ISO 3166-1 alpha-2 codes", parse: scalarItem(ParseCountry), format: Country.String},
		func(m *matchSpec) *[]matchItem[Country] { return &m.Countries }, "sources in these countries (needs asn_data)"),
	yamlcheck.Func("protocol", "one of tcp, udp, icmp, icmpv6", "packets of this protocol (the ones the data plane parses)",
		func(c *yamlcheck.Checker, n *yaml.Node, where string, m *matchSpec) {
			if s, ok := c.Scalar(n, where); ok {
				m.Protocol = strings.ToLower(s)
			}
		}, func(m *matchSpec) string { return m.Protocol }),
	yamlcheck.Val[matchSpec, []matchItem[uint16]]("src_ports", portList("src_ports"),
		func(m *matchSpec) *[]matchItem[uint16] { return &m.SrcPorts }, "with tcp or udp: these source ports (tried first: the reflection case)"),
	yamlcheck.Val[matchSpec, []matchItem[uint16]]("dst_ports", portList("dst_ports"),
		func(m *matchSpec) *[]matchItem[uint16] { return &m.DstPorts }, "with tcp or udp: these destination ports"),
	yamlcheck.Val[matchSpec, []matchItem[uint16]]("icmp_types", itemList[uint16]{Key: "icmp_types", Item: "icmp type",
		Desc: "list of ICMP types, 0 to 255", parse: numberItem(0, 255), format: func(t uint16) string { return strconv.Itoa(int(t)) }},
		func(m *matchSpec) *[]matchItem[uint16] { return &m.ICMPTypes }, "with icmp or icmpv6: these types (compiled as destination entries)"),
)

// match parses a rule's match: the walk, then the rules across its fields
// and the claims.
func (ps *parser) match(n *yaml.Node, rule string) Match {
	where := rule + " match"
	var spec matchSpec
	f := matchTable.ParseIn(&ps.Checker, n, where, where+" ", &spec)
	if f == nil {
		return Match{}
	}
	var m Match
	var kinds []string
	for _, k := range []string{"prefixes", "asns", "countries", "protocol"} {
		if _, ok := f[k]; ok {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) != 1 {
		if len(kinds) == 0 {
			ps.Errorf(n, "%s needs exactly one of prefixes, asns, countries or protocol", where)
		} else {
			ps.Errorf(n, "%s has %s; a rule matches by exactly one of prefixes, asns, countries or protocol (split it into several rules)", where, strings.Join(kinds, " and "))
		}
		return Match{}
	}
	_, hasProto := f["protocol"]
	for _, k := range []string{"src_ports", "dst_ports", "icmp_types"} {
		if v, ok := f[k]; ok && !hasProto {
			ps.Errorf(v, "%s: %s needs a protocol", where, k)
		}
	}
	// A list written empty (or as nothing) is a mistake: leave it out.
	empty := func(key, note string) {
		if v := f[key]; v.Kind == yaml.SequenceNode && len(v.Content) == 0 || yamlcheck.IsNull(v) {
			ps.Errorf(v, "%s %s is empty%s", where, key, note)
		}
	}
	switch kinds[0] {
	case "prefixes":
		m.Kind = MatchPrefix
		empty("prefixes", "")
		m.Prefixes = claimItems(ps, spec.Prefixes, rule, func(p netip.Prefix) (string, string) { return "prefix " + p.String(), "prefix " + p.String() })
	case "asns":
		m.Kind = MatchASN
		empty("asns", "")
		m.ASNs = claimItems(ps, spec.ASNs, rule, func(a uint32) (string, string) {
			s := strconv.FormatUint(uint64(a), 10)
			return "asn " + s, "AS" + s
		})
	case "countries":
		m.Kind = MatchCountry
		empty("countries", "")
		m.Countries = claimItems(ps, spec.Countries, rule, func(c Country) (string, string) { return "country " + c.String(), "country " + c.String() })
	case "protocol":
		m.Kind = MatchL4
		ps.l4Match(f, where, rule, &spec, &m, empty)
	}
	return m
}

// l4Match checks and claims a protocol match (after the walk).
func (ps *parser) l4Match(f map[string]*yaml.Node, where, rule string, spec *matchSpec, m *Match, empty func(key, note string)) {
	pn := f["protocol"]
	s := spec.Protocol
	if s == "" && (pn.Kind != yaml.ScalarNode || yamlcheck.IsNull(pn)) {
		return // reported
	}
	num, known := protocolNumbers()[s]
	if !known {
		ps.Errorf(pn, "%s: unknown protocol %q; allowed: tcp, udp, icmp, icmpv6", where, s)
		return
	}
	m.Protocol = num
	if v, ok := f["icmp_types"]; ok {
		if !isICMP(num) {
			ps.Errorf(v, "%s: icmp_types apply to icmp and icmpv6, not %s", where, s)
		} else {
			if v.Kind != yaml.ScalarNode && (v.Kind != yaml.SequenceNode || len(v.Content) == 0) || yamlcheck.IsNull(v) {
				ps.Errorf(v, "%s icmp_types is empty; leave it out to match the protocol alone", where)
			}
			for _, t := range claimItems(ps, spec.ICMPTypes, rule, func(t uint16) (string, string) {
				key := fmt.Sprintf("%s type %d", s, t)
				return "l4 " + key, key
			}) {
				m.ICMPTypes = append(m.ICMPTypes, uint8(t))
			}
		}
	}
	for _, k := range []string{"src_ports", "dst_ports"} {
		v, ok := f[k]
		if !ok {
			continue
		}
		if !hasPorts(num) {
			ps.Errorf(v, "%s: %s has no ports; ports apply to tcp and udp (for icmp, use icmp_types)", where, s)
			continue
		}
		empty(k, "; leave it out to match the protocol alone")
		dir := strings.TrimSuffix(k, "_ports")
		claim := func(p uint16) (string, string) {
			key := fmt.Sprintf("%s %s port %d", s, dir, p)
			return "l4 " + key, key
		}
		if k == "src_ports" {
			m.SrcPorts = claimItems(ps, spec.SrcPorts, rule, claim)
		} else {
			m.DstPorts = claimItems(ps, spec.DstPorts, rule, claim)
		}
	}
	_, src := f["src_ports"]
	_, dst := f["dst_ports"]
	_, types := f["icmp_types"]
	if !src && !dst && !types {
		ps.claim(pn, "l4 "+s+" any", "protocol "+s+" (without ports)", rule)
	}
}

// claimItems claims each item for rule (key: the claim's key and how a
// clash names it) and returns the ones it got.
func claimItems[V any](ps *parser, items []matchItem[V], rule string, key func(V) (string, string)) []V {
	var out []V
	for _, it := range items {
		if k, what := key(it.V); ps.claim(it.n, k, what, rule) {
			out = append(out, it.V)
		}
	}
	return out
}
