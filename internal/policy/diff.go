package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Change is one line of a diff between two compiled policies.
type Change struct {
	// Op is '+' (added), '-' (removed) or '~' (changed).
	Op byte
	// Text says what, e.g. "rule web per_source packets 100/s -> 200/s".
	Text string
}

func (c Change) String() string { return string(c.Op) + " " + c.Text }

// FormatDiff prints changes one per line, as `policy diff` shows them.
func FormatDiff(changes []Change) string {
	var b strings.Builder
	for _, c := range changes {
		b.WriteString(c.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Diff lists what changes when from is replaced by to, for humans, in a
// fixed order: settings, rules (default first, then by name), L4 entries,
// list entries (by prefix), then a summary of the prefix-facts trie. Either
// may be nil (an empty policy).
func Diff(from, to *Compiled) []Change {
	if from == nil {
		from = &Compiled{}
	}
	if to == nil {
		to = &Compiled{}
	}
	var d differ
	d.settings(from, to)
	d.rules(from, to)
	d.l4(from, to)
	d.lists(from, to)
	d.prefixes(from, to)
	return d.out
}

type differ struct{ out []Change }

func (d *differ) add(op byte, format string, args ...any) {
	d.out = append(d.out, Change{Op: op, Text: fmt.Sprintf(format, args...)})
}

// emit adds one line as a yamlcheck.Table's Diff writes it.
func (d *differ) emit(op byte, text string) {
	d.out = append(d.out, Change{Op: op, Text: text})
}

// field reports a changed value as "~ what old -> new".
func (d *differ) field(what, old, new string) {
	if old != new {
		d.add('~', "%s %s -> %s", what, old, new)
	}
}

func orNone(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

func (d *differ) settings(a, b *Compiled) {
	d.field("setting mode", orNone(string(a.Mode)), orNone(string(b.Mode)))
	d.field("setting malformed", orNone(string(a.Malformed)), orNone(string(b.Malformed)))
	d.field("setting clock", orNone(string(a.Clock)), orNone(string(b.Clock)))
	d.bucket("setting global", a.Global, b.Global)
	samplingTable.Diff(&a.Sampling, &b.Sampling, d.emit)
	d.standing(a.Standing, b.Standing)
	ai := map[string]Interface{}
	for _, i := range a.Interfaces {
		ai[i.Name] = i
	}
	bi := map[string]Interface{}
	for _, i := range b.Interfaces {
		bi[i.Name] = i
	}
	for _, name := range sortedKeys(ai, bi) {
		x, inA := ai[name]
		y, inB := bi[name]
		switch {
		case !inB:
			d.add('-', "interface %s", name)
		case !inA:
			d.add('+', "interface %s xdp_mode %s", name, y.XDPMode)
		default:
			d.field("interface "+name+" xdp_mode", string(x.XDPMode), string(y.XDPMode))
		}
	}
	tablesTable.Diff(&a.Tables, &b.Tables, d.emit)
	metricsTable.Diff(&a.Metrics, &b.Metrics, d.emit)
	asnDataTable.Diff(&a.ASNData, &b.ASNData, d.emit)
}

func sortedKeys[V any](a, b map[string]V) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// bucket reports changes of a bucket's two limits.
func (d *differ) bucket(what string, a, b Bucket) {
	d.limit(what+" packets", a.Packets, b.Packets, Packets)
	d.limit(what+" bytes", a.Bytes, b.Bytes, Bytes)
}

func (d *differ) limit(what string, a, b Limit, unit Unit) {
	switch {
	case a.IsSet() != b.IsSet():
		d.add('~', "%s %s -> %s", what, a.format(unit), b.format(unit))
	case !a.IsSet():
	default:
		if !a.Rate.Equal(b.Rate) {
			d.add('~', "%s %s -> %s", what, FormatRate(a.Rate, unit), FormatRate(b.Rate, unit))
		}
		if a.Burst != b.Burst {
			d.add('~', "%s burst %s -> %s", what, FormatBurst(a.Burst, unit), FormatBurst(b.Burst, unit))
		}
	}
}

// describeMatch prints a rule's match as the file would say it.
func describeMatch(m Match) string {
	var parts []string
	switch m.Kind {
	case MatchPrefix:
		for _, p := range m.Prefixes {
			parts = append(parts, p.String())
		}
		return "prefixes " + strings.Join(parts, ", ")
	case MatchASN:
		for _, a := range m.ASNs {
			parts = append(parts, "AS"+strconv.FormatUint(uint64(a), 10))
		}
		return "asns " + strings.Join(parts, ", ")
	case MatchCountry:
		for _, c := range m.Countries {
			parts = append(parts, c.String())
		}
		return "countries " + strings.Join(parts, ", ")
	case MatchL4:
		s := "protocol " + ProtocolName(m.Protocol)
		ports := func(ps []uint16) string {
			out := make([]string, len(ps))
			for i, p := range ps {
				out[i] = strconv.Itoa(int(p))
			}
			return strings.Join(out, ", ")
		}
		if len(m.SrcPorts) > 0 {
			s += " src_ports " + ports(m.SrcPorts)
		}
		if len(m.DstPorts) > 0 {
			s += " dst_ports " + ports(m.DstPorts)
		}
		if len(m.ICMPTypes) > 0 {
			types := make([]uint16, len(m.ICMPTypes))
			for i, t := range m.ICMPTypes {
				types[i] = uint16(t)
			}
			s += " icmp_types " + ports(types)
		}
		return s
	}
	return "everything else"
}

func describeAggregate(r CompiledRule) string {
	if r.Aggregate == AggregateDerived {
		return fmt.Sprintf("per /%d (IPv4) and /%d (IPv6)", r.AggregateKey.V4, r.AggregateKey.V6)
	}
	return r.Aggregate.String()
}

func describeBucket(b Bucket) string {
	var parts []string
	if b.Packets.IsSet() {
		parts = append(parts, "packets "+b.Packets.format(Packets))
	}
	if b.Bytes.IsSet() {
		parts = append(parts, "bytes "+b.Bytes.format(Bytes))
	}
	return strings.Join(parts, ", ")
}

// describeRule prints a whole rule on one line, for added rules.
func describeRule(r CompiledRule) string {
	parts := []string{fmt.Sprintf("rule %s (id %#x): match %s, action %s, mode %s", r.Name, r.ID, describeMatch(r.Match), r.Action, r.Mode)}
	if r.PerSource.IsSet() {
		parts = append(parts, fmt.Sprintf("per_source /%d /%d %s", r.SourceKey.V4, r.SourceKey.V6, describeBucket(r.PerSource)))
	}
	if r.Aggregate != AggregateNone {
		parts = append(parts, fmt.Sprintf("per_prefix %s %s", describeAggregate(r), describeBucket(r.PerPrefix)))
	}
	if r.PerASN.IsSet() {
		parts = append(parts, "per_asn "+describeBucket(r.PerASN))
	}
	return strings.Join(parts, "; ")
}

func (d *differ) rules(a, b *Compiled) {
	ar := map[string]CompiledRule{}
	for _, r := range a.Rules {
		ar[r.Name] = r
	}
	br := map[string]CompiledRule{}
	for _, r := range b.Rules {
		br[r.Name] = r
	}
	names := sortedKeys(ar, br)
	// The default rule first.
	slices.SortStableFunc(names, func(x, y string) int {
		return cmp.Compare(boolInt(x != DefaultRuleName), boolInt(y != DefaultRuleName))
	})
	for _, name := range names {
		x, inA := ar[name]
		y, inB := br[name]
		switch {
		case !inB:
			d.add('-', "rule %s", name)
		case !inA:
			d.add('+', "%s", describeRule(y))
		default:
			w := "rule " + name
			d.field(w+" match", describeMatch(x.Match), describeMatch(y.Match))
			d.field(w+" action", string(x.Action), string(y.Action))
			d.field(w+" mode", string(x.Mode), string(y.Mode))
			d.field(w+" per_source key", fmt.Sprintf("/%d /%d", x.SourceKey.V4, x.SourceKey.V6), fmt.Sprintf("/%d /%d", y.SourceKey.V4, y.SourceKey.V6))
			d.bucket(w+" per_source", x.PerSource, y.PerSource)
			d.field(w+" per_prefix group", describeAggregate(x), describeAggregate(y))
			d.bucket(w+" per_prefix", x.PerPrefix, y.PerPrefix)
			d.bucket(w+" per_asn", x.PerASN, y.PerASN)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (d *differ) l4(a, b *Compiled) {
	type key struct {
		proto uint8
		dir   PortDir
		port  uint16
	}
	names := func(c *Compiled) map[uint32]string {
		m := map[uint32]string{}
		for _, r := range c.Rules {
			m[r.ID] = r.Name
		}
		return m
	}
	an, bn := names(a), names(b)
	am := map[key]string{}
	for _, e := range a.L4 {
		am[key{e.Protocol, e.Dir, e.Port}] = an[e.RuleID]
	}
	bm := map[key]string{}
	var keys []key
	for _, e := range b.L4 {
		k := key{e.Protocol, e.Dir, e.Port}
		bm[k] = bn[e.RuleID]
		keys = append(keys, k)
	}
	for _, e := range a.L4 {
		if k := (key{e.Protocol, e.Dir, e.Port}); bm[k] == "" {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(x, y key) int {
		return cmp.Or(cmp.Compare(x.proto, y.proto), cmp.Compare(x.dir, y.dir), cmp.Compare(x.port, y.port))
	})
	for _, k := range keys {
		what := "l4 " + ProtocolName(k.proto)
		switch {
		case k.dir == PortAny:
		case isICMP(k.proto):
			what += fmt.Sprintf(" type %d", k.port)
		default:
			what += fmt.Sprintf(" %s port %d", k.dir, k.port)
		}
		x, y := am[k], bm[k]
		switch {
		case x == "":
			d.add('+', "%s -> rule %s", what, y)
		case y == "":
			d.add('-', "%s -> rule %s", what, x)
		case x != y:
			d.add('~', "%s rule %s -> %s", what, x, y)
		}
	}
}

func describeListing(verb string, l Listing) string {
	if l.Until.IsZero() {
		return verb
	}
	return verb + " until " + l.Until.UTC().Format(time.RFC3339)
}

// describeRecord prints what a lists-trie entry does, without its prefix.
func describeRecord(r ListRecord) string {
	switch {
	case r.Deny.Listed && r.Allow.Listed:
		return describeListing("deny", r.Deny) + ", then " + describeListing("allow", r.Allow)
	case r.Deny.Listed:
		return describeListing("deny", r.Deny)
	case r.Allow.Listed:
		return describeListing("allow", r.Allow)
	}
	return "unlisted (keeps IPv6 entries off IPv4)"
}

func (d *differ) lists(a, b *Compiled) {
	am := map[netip.Prefix]ListRecord{}
	for _, r := range a.Lists {
		am[r.Prefix] = r
	}
	bm := map[netip.Prefix]ListRecord{}
	var keys []netip.Prefix
	for _, r := range b.Lists {
		bm[r.Prefix] = r
		keys = append(keys, r.Prefix)
	}
	for _, r := range a.Lists {
		if _, ok := bm[r.Prefix]; !ok {
			keys = append(keys, r.Prefix)
		}
	}
	slices.SortFunc(keys, compareOutput)
	for _, p := range keys {
		x, inA := am[p]
		y, inB := bm[p]
		switch {
		case !inA:
			d.add('+', "list %s %s", p, describeRecord(y))
		case !inB:
			d.add('-', "list %s %s", p, describeRecord(x))
		default:
			d.field("list "+p.String(), describeRecord(x), describeRecord(y))
		}
	}
}

// prefixes summarises the prefix-facts trie: it can hold a million entries,
// so the diff counts them rather than listing them.
func (d *differ) prefixes(a, b *Compiled) {
	am := make(map[netip.Prefix]PrefixFact, len(a.Prefixes))
	for _, f := range a.Prefixes {
		am[f.Prefix] = f
	}
	var added, removed, changed int
	seen := 0
	for _, f := range b.Prefixes {
		old, ok := am[f.Prefix]
		switch {
		case !ok:
			added++
		case old != f:
			changed++
			seen++
		default:
			seen++
		}
	}
	removed = len(a.Prefixes) - seen
	if added+removed+changed > 0 {
		d.add('~', "prefix facts %d -> %d entries (%d added, %d removed, %d changed)", len(a.Prefixes), len(b.Prefixes), added, removed, changed)
	}
}

// L7Differ lists the changes between two l7: sections (nil: none).
// internal/policy keeps the section as written and cannot decode it
// (internal/l7 imports it); rls.DiffL7 is the one that does, from the l7
// field tables.
type L7Differ func(from, to *yaml.Node) []Change

// DiffSections lists what Diff does not see because it is not compiled into
// the data plane: the l7: section (by l7; nil leaves it out), fleet, syn,
// shield and bgp. Either policy may be nil (an empty policy).
func DiffSections(from, to *Policy, l7 L7Differ) []Change {
	if from == nil {
		from = &Policy{}
	}
	if to == nil {
		to = &Policy{}
	}
	var d differ
	if l7 != nil {
		d.out = append(d.out, l7(from.L7, to.L7)...)
	}
	d.fleet(from, to)
	d.syn(from.SYN, to.SYN)
	d.shield(from.Shield, to.Shield)
	d.bgp(from.BGP, to.BGP)
	return d.out
}
