package policy

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/edgeguard/edgeguard/internal/asn"
)

// ErrTableTooSmall means the compiled policy needs more entries than a table
// configured under tables: holds. Raise the named capacity.
var ErrTableTooSmall = errors.New("table too small")

// Compiled is a policy in the form the data plane holds: rules with exact
// bucket parameters, and the entries of the prefix-facts trie, the lists
// trie and the L4 table. It is a pure value and the only compiled form:
// internal/maps applies it (Generations.Stage and Commit), turning it into the data plane's
// structs and enums (bpf/headers, through bpf2go).
type Compiled struct {
	Mode      Mode
	Malformed Verdict
	Clock     Clock
	Global    Bucket
	// GlobalReserve is the global bucket's reserve, in parts per million.
	GlobalReserve uint32
	// Samples is the budget of drop samples the data plane sends to user
	// space (top-talker reports, explain): SampleBudget.
	Samples Limit
	// Standing are the standing rules; KnownGood sorted, deduplicated.
	Standing Standing
	// Sampling is the 1-in-N sampler's settings (sampling:).
	Sampling   Sampling
	Interfaces []Interface
	Tables     Tables
	Metrics    Metrics
	ASNData    ASNData
	// Rules holds the default rule (id 0) first, then the file's rules in
	// file order.
	Rules []CompiledRule
	// Prefixes are the prefix-facts trie entries, sorted (IPv4 first, then
	// by address, then by length). A longest-prefix match on a source gives
	// its rule, ASN and country; no match means the default rule, ASN 0.
	Prefixes []PrefixFact
	// Lists are the lists trie entries, sorted like Prefixes, each carrying
	// what it inherits from the entries that cover it.
	Lists []ListRecord
	// L4 are the L4 table entries, sorted by protocol, direction, port.
	L4 []L4Entry
	// Warnings are legal but probably unintended things, for humans.
	Warnings []string
}

// SampleBudget is how many drop samples per second the data plane sends to
// user space for top-talker reports and explain: 1,000/s, burst 100.
func SampleBudget() Limit { return Limit{Rate: Rate{Count: 1000, Per: time.Second}, Burst: 100} }

// AggregateMode says how a rule's per-prefix aggregate is keyed.
type AggregateMode uint8

// Aggregate modes.
const (
	// AggregateNone: the rule has no per-prefix aggregate.
	AggregateNone AggregateMode = iota
	// AggregateWhole: all sources of the rule share one bucket.
	AggregateWhole
	// AggregateDerived: one bucket per source masked to the rule's
	// aggregate key (v4 and v6 lengths).
	AggregateDerived
)

func (m AggregateMode) String() string {
	switch m {
	case AggregateWhole:
		return "whole"
	case AggregateDerived:
		return "derived"
	}
	return "none"
}

// CompiledRule is one rule as the data plane applies it.
type CompiledRule struct {
	ID     uint32
	Name   string
	Action Action
	Mode   RuleMode
	// Match is what the rule matched in the file (for diffs and display);
	// the data plane sees it through Prefixes and L4.
	Match Match
	// PerSource is keyed by the source masked to SourceKey.
	PerSource Bucket
	SourceKey KeyBits
	// PerPrefix is keyed per Aggregate (and AggregateKey when derived).
	PerPrefix    Bucket
	Aggregate    AggregateMode
	AggregateKey KeyBits
	// PerASN is keyed by the source's ASN. Sources with ASN 0 (unknown)
	// have no ASN bucket.
	PerASN Bucket
	// Reserve is the share of PerPrefix's and PerASN's burst tolerance
	// that only established and validated sources may use, in parts per
	// million.
	Reserve uint32
}

// PrefixFact is one prefix-facts trie entry.
type PrefixFact struct {
	Prefix  netip.Prefix
	RuleID  uint32
	ASN     uint32
	Country Country
}

// Listing is one list's hold on a prefix: Listed, until Until (zero: never
// expires). An expired listing matches nothing.
type Listing struct {
	Listed bool
	Until  time.Time
}

// ListRecord is one lists-trie entry. The data plane reads only the most
// specific entry, so each record already carries the listings of every entry
// that covers it: a deny covering an allow makes the allow's record a deny
// too (deny wins while both are active).
type ListRecord struct {
	Prefix netip.Prefix
	Deny   Listing
	Allow  Listing
}

// PortDir says which port an L4 entry matches. For ICMP and ICMPv6 the data
// plane puts the ICMP type where the destination port would be, so an
// icmp_types match compiles to PortDst entries.
type PortDir uint8

// Port directions.
const (
	// PortAny: the protocol alone; Port is 0.
	PortAny PortDir = iota
	// PortSrc: the source port.
	PortSrc
	// PortDst: the destination port.
	PortDst
)

func (d PortDir) String() string {
	switch d {
	case PortSrc:
		return "src"
	case PortDst:
		return "dst"
	}
	return "any"
}

// L4Entry sends packets of Protocol (and Port in Dir) to a rule.
type L4Entry struct {
	Protocol uint8
	Dir      PortDir
	Port     uint16
	RuleID   uint32
}

// Compile turns a valid policy and optional IP-to-ASN data into the data
// plane's entries. It is pure and deterministic: the same input gives the
// same output. It fails only when a table is too small (ErrTableTooSmall) or
// the ASN data contradicts itself. p must come from Load or Parse: Compile
// does not validate it again.
func Compile(p *Policy, asnData []asn.Entry) (*Compiled, error) {
	c := &Compiled{
		Mode:          p.Mode,
		Malformed:     p.Malformed,
		Clock:         p.Clock,
		Global:        p.Global,
		GlobalReserve: p.GlobalReserve,
		Samples:       SampleBudget(),
		Standing:      p.Standing,
		Sampling:      p.Sampling,
		Interfaces:    slices.Clone(p.Interfaces),
		Tables:        p.Tables,
		Metrics:       p.Metrics,
		ASNData:       p.ASNData,
	}
	c.Rules = append(c.Rules, compileRule(0, DefaultRuleName, ActionLimit, RuleModeInherit, Match{}, p.Defaults))
	for _, r := range p.Rules {
		c.Rules = append(c.Rules, compileRule(RuleID(r.Name), r.Name, r.Action, r.Mode, r.Match, r.Limits))
	}
	var err error
	if c.Prefixes, c.Warnings, err = compilePrefixes(p.Rules, asnData); err != nil {
		return nil, err
	}
	c.Lists = compileLists(p.Deny, p.Allow)
	c.L4 = compileL4(p.Rules)
	var errs []error
	check := func(name string, need int, have uint32) {
		if uint64(need) > uint64(have) {
			errs = append(errs, fmt.Errorf("compile policy: tables.%s is %d but the policy needs %d entries; raise it: %w", name, have, need, ErrTableTooSmall))
		}
	}
	check("prefix_entries", len(c.Prefixes), p.Tables.PrefixEntries)
	check("list_entries", len(c.Lists), p.Tables.ListEntries)
	check("max_rules", len(c.Rules), p.Tables.MaxRules)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

func compileRule(id uint32, name string, action Action, mode RuleMode, m Match, l Limits) CompiledRule {
	r := CompiledRule{ID: id, Name: name, Action: action, Mode: mode, Match: m, SourceKey: l.PerSource.Key}
	if action != ActionLimit {
		return r
	}
	r.PerSource = l.PerSource.Bucket
	r.PerASN = l.PerASN
	r.Reserve = l.Reserve
	if l.PerPrefix.IsSet() {
		r.PerPrefix = l.PerPrefix.Bucket
		if l.PerPrefix.Whole {
			r.Aggregate = AggregateWhole
		} else {
			r.Aggregate, r.AggregateKey = AggregateDerived, l.PerPrefix.Derive
		}
	}
	return r
}

// unify maps an IPv4 prefix into IPv4-mapped IPv6; IPv6 stays as is.
func unify(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4() {
		return netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96)
	}
	return p
}

// ununify is unify's inverse.
func ununify(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// comparePrefix orders prefixes so that every prefix comes after all of its
// ancestors and before its descendants' siblings: by address, then length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// compareOutput orders output prefixes: IPv4 first, then by address, length.
func compareOutput(a, b netip.Prefix) int {
	if a.Addr().Is4() != b.Addr().Is4() {
		if a.Addr().Is4() {
			return -1
		}
		return 1
	}
	return comparePrefix(a, b)
}

// walkNested visits prefixes (unified, sorted by comparePrefix) with the
// index of the nearest ancestor in the list (-1 for none). The IPv4 range
// must be present as a node when anything covers it, so that IPv6 entries
// never leak into IPv4 sources: callers add it.
func walkNested(prefixes []netip.Prefix, visit func(i, parent int)) {
	var stack []int
	for i, p := range prefixes {
		for len(stack) > 0 && !prefixes[stack[len(stack)-1]].Overlaps(p) {
			stack = stack[:len(stack)-1]
		}
		parent := -1
		if len(stack) > 0 {
			parent = stack[len(stack)-1]
		}
		visit(i, parent)
		stack = append(stack, i)
	}
}

// sortKey orders unified prefixes like comparePrefix, with integer compares.
type sortKey struct {
	hi, lo uint64
	bits   int
}

func keyOf(p netip.Prefix) sortKey {
	b := p.Addr().As16()
	return sortKey{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:]), bits: p.Bits()}
}

func compareKey(a, b sortKey) int {
	return cmp.Or(cmp.Compare(a.hi, b.hi), cmp.Compare(a.lo, b.lo), cmp.Compare(a.bits, b.bits))
}

type factsNode struct {
	key        sortKey
	prefix     netip.Prefix // unified
	hasRule    bool
	ruleID     uint32
	hasASN     bool
	asn        uint32
	country    Country
	boundary   bool // the IPv4 range: inherits nothing from IPv6 above it
	facts      PrefixFact
	hasRuleEff bool
	ruleEff    uint32
	hasASNEff  bool
	asnEff     uint32
	countryEff Country
}

// ipv4Range is 0.0.0.0/0 in the unified space.
func ipv4Range() netip.Prefix { return unify(netip.PrefixFrom(netip.IPv4Unspecified(), 0)) }

func compilePrefixes(rules []Rule, asnData []asn.Entry) ([]PrefixFact, []string, error) {
	nodes := make([]factsNode, 0, len(asnData)+16)
	asnRule := map[uint32]uint32{}
	countryRule := map[Country]uint32{}
	for _, r := range rules {
		id := RuleID(r.Name)
		for _, p := range r.Match.Prefixes {
			nodes = append(nodes, factsNode{prefix: unify(p.Masked()), hasRule: true, ruleID: id})
		}
		for _, a := range r.Match.ASNs {
			asnRule[a] = id
		}
		for _, c := range r.Match.Countries {
			countryRule[c] = id
		}
	}
	seenASN := map[uint32]bool{}
	seenCountry := map[Country]bool{}
	for _, e := range asnData {
		if !e.Prefix.IsValid() {
			return nil, nil, fmt.Errorf("compile policy: asn data holds an invalid prefix (AS%d)", e.ASN)
		}
		nodes = append(nodes, factsNode{prefix: unify(e.Prefix.Masked()), hasASN: true, asn: e.ASN, country: Country(e.Country)})
		seenASN[e.ASN] = true
		seenCountry[Country(e.Country)] = true
	}
	var warnings []string
	for _, r := range rules {
		for _, a := range r.Match.ASNs {
			if !seenASN[a] {
				warnings = append(warnings, fmt.Sprintf("rule %s: AS%d has no prefixes in the ASN data; the rule matches nothing for it", r.Name, a))
			}
		}
		for _, c := range r.Match.Countries {
			if !seenCountry[c] {
				warnings = append(warnings, fmt.Sprintf("rule %s: country %s has no prefixes in the ASN data; the rule matches nothing for it", r.Name, c))
			}
		}
	}
	if len(nodes) == 0 {
		return nil, warnings, nil
	}
	nodes = append(nodes, factsNode{prefix: ipv4Range(), boundary: true})
	for i := range nodes {
		nodes[i].key = keyOf(nodes[i].prefix)
	}
	slices.SortFunc(nodes, func(a, b factsNode) int { return compareKey(a.key, b.key) })
	// Merge nodes of the same prefix: a rule prefix, an ASN range and the
	// IPv4 boundary may coincide.
	merged := nodes[:1]
	for _, n := range nodes[1:] {
		m := &merged[len(merged)-1]
		if m.prefix != n.prefix {
			merged = append(merged, n)
			continue
		}
		if n.hasASN && m.hasASN && (m.asn != n.asn || m.country != n.country) {
			return nil, nil, fmt.Errorf("compile policy: asn data lists %s twice (AS%d %s and AS%d %s)",
				ununify(n.prefix), m.asn, m.country, n.asn, n.country)
		}
		if n.hasRule {
			m.hasRule, m.ruleID = true, n.ruleID
		}
		if n.hasASN {
			m.hasASN, m.asn, m.country = true, n.asn, n.country
		}
		m.boundary = m.boundary || n.boundary
	}
	nodes = merged
	prefixes := make([]netip.Prefix, len(nodes))
	for i := range nodes {
		prefixes[i] = nodes[i].prefix
	}
	out := make([]PrefixFact, 0, len(nodes))
	walkNested(prefixes, func(i, parent int) {
		n := &nodes[i]
		if parent >= 0 && !n.boundary {
			up := &nodes[parent]
			n.hasRuleEff, n.ruleEff = up.hasRuleEff, up.ruleEff
			n.hasASNEff, n.asnEff, n.countryEff = up.hasASNEff, up.asnEff, up.countryEff
		}
		if n.hasRule {
			n.hasRuleEff, n.ruleEff = true, n.ruleID
		}
		if n.hasASN {
			n.hasASNEff, n.asnEff, n.countryEff = true, n.asn, n.country
		}
		n.facts = PrefixFact{Prefix: ununify(n.prefix), ASN: n.asnEff, Country: n.countryEff}
		switch {
		case n.hasRuleEff:
			n.facts.RuleID = n.ruleEff
		case !n.hasASNEff:
		case asnRule[n.asnEff] != 0:
			n.facts.RuleID = asnRule[n.asnEff]
		case countryRule[n.countryEff] != 0:
			n.facts.RuleID = countryRule[n.countryEff]
		}
		// What a lookup here would return without this entry: the parent's
		// facts, or no match (default rule, no ASN) at the top.
		var inherited PrefixFact
		if parent >= 0 {
			inherited = nodes[parent].facts
		}
		inherited.Prefix = n.facts.Prefix
		if n.facts != inherited {
			out = append(out, n.facts)
		}
	})
	return compactEntries(out, func(f *PrefixFact) *netip.Prefix { return &f.Prefix }), warnings, nil
}

// compactEntries runs compact over entries that carry their own prefix
// (prefix returns a pointer to that field); values compare without it.
func compactEntries[T comparable](out []T, prefix func(*T) *netip.Prefix) []T {
	es := make([]trieEntry[T], len(out))
	for i, v := range out {
		p := *prefix(&v)
		*prefix(&v) = netip.Prefix{}
		es[i] = trieEntry[T]{prefix: p, value: v}
	}
	es = compact(es)
	out = out[:len(es)]
	for i, e := range es {
		out[i] = e.value
		*prefix(&out[i]) = e.prefix
	}
	return out
}

// later returns the listing that lasts longer (never-expiring wins).
func later(a, b Listing) Listing {
	switch {
	case !a.Listed:
		return b
	case !b.Listed:
		return a
	case a.Until.IsZero() || b.Until.IsZero():
		return Listing{Listed: true}
	case a.Until.After(b.Until):
		return a
	}
	return b
}

type listNode struct {
	own      ListRecord
	eff      ListRecord
	boundary bool
}

func compileLists(deny, allow []ListEntry) []ListRecord {
	nodes := map[netip.Prefix]*listNode{}
	node := func(p netip.Prefix) *listNode {
		u := unify(p.Masked())
		n := nodes[u]
		if n == nil {
			n = &listNode{}
			nodes[u] = n
		}
		return n
	}
	for _, e := range deny {
		n := node(e.Prefix)
		n.own.Deny = later(n.own.Deny, Listing{Listed: true, Until: e.Expires})
	}
	for _, e := range allow {
		n := node(e.Prefix)
		n.own.Allow = later(n.own.Allow, Listing{Listed: true, Until: e.Expires})
	}
	if len(nodes) == 0 {
		return nil
	}
	node(netip.PrefixFrom(netip.IPv4Unspecified(), 0)).boundary = true
	order := make([]netip.Prefix, 0, len(nodes))
	for p := range nodes {
		order = append(order, p)
	}
	slices.SortFunc(order, comparePrefix)
	var out []ListRecord
	walkNested(order, func(i, parent int) {
		n := nodes[order[i]]
		var inherited ListRecord
		if parent >= 0 {
			inherited = nodes[order[parent]].eff
		}
		n.eff = n.own
		if !n.boundary {
			n.eff.Deny = later(inherited.Deny, n.own.Deny)
			n.eff.Allow = later(inherited.Allow, n.own.Allow)
		}
		if n.eff.Deny.Listed && n.eff.Deny.Until.IsZero() {
			n.eff.Allow = Listing{} // a permanent deny makes any allow moot
		}
		n.eff.Prefix = ununify(order[i])
		inherited.Prefix = n.eff.Prefix
		if n.eff != inherited {
			out = append(out, n.eff)
		}
	})
	return compactEntries(out, func(r *ListRecord) *netip.Prefix { return &r.Prefix })
}

func compileL4(rules []Rule) []L4Entry {
	var out []L4Entry
	for _, r := range rules {
		if r.Match.Kind != MatchL4 {
			continue
		}
		id := RuleID(r.Name)
		if len(r.Match.SrcPorts) == 0 && len(r.Match.DstPorts) == 0 && len(r.Match.ICMPTypes) == 0 {
			out = append(out, L4Entry{Protocol: r.Match.Protocol, Dir: PortAny, RuleID: id})
		}
		for _, port := range r.Match.SrcPorts {
			out = append(out, L4Entry{Protocol: r.Match.Protocol, Dir: PortSrc, Port: port, RuleID: id})
		}
		for _, port := range r.Match.DstPorts {
			out = append(out, L4Entry{Protocol: r.Match.Protocol, Dir: PortDst, Port: port, RuleID: id})
		}
		for _, typ := range r.Match.ICMPTypes {
			out = append(out, L4Entry{Protocol: r.Match.Protocol, Dir: PortDst, Port: uint16(typ), RuleID: id})
		}
	}
	slices.SortFunc(out, func(a, b L4Entry) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Dir, b.Dir), cmp.Compare(a.Port, b.Port))
	})
	return out
}
