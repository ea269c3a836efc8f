package policy

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// The limit sections (per_source, per_prefix, per_asn, reserve) of
// defaults: and of each rule, one row per knob. A section the file writes
// replaces the inherited limits (Fresh) but keeps the inherited key and
// group unless it writes them; the checks across fields (a group for
// per_prefix limits, the reserve against the bursts) run after the walk
// (limitChecks).

// keyTable is a key or group: {ipv4: N, ipv6: N} prefix lengths.
var keyTable = yamlcheck.NewTable("key",
	yamlcheck.Val[KeyBits, uint8]("ipv4", yamlcheck.Uint[uint8]{Min: 1, Max: 32}, func(k *KeyBits) *uint8 { return &k.V4 },
		"IPv4 prefix length"),
	yamlcheck.Val[KeyBits, uint8]("ipv6", yamlcheck.Uint[uint8]{Min: 1, Max: 128}, func(k *KeyBits) *uint8 { return &k.V6 },
		"IPv6 prefix length"),
)

func limitRows[S any](at func(s *S) *Bucket, what string) []yamlcheck.Field[S] {
	return []yamlcheck.Field[S]{
		yamlcheck.Val[S, Limit]("packets", limitKind{Unit: Packets}, func(s *S) *Limit { return &at(s).Packets },
			"packet limit of "+what),
		yamlcheck.Val[S, Limit]("bytes", limitKind{Unit: Bytes}, func(s *S) *Limit { return &at(s).Bytes },
			"byte limit of "+what),
	}
}

// perSourceTable is per_source: each source's bucket, keyed by its
// address masked to key.
var perSourceTable = yamlcheck.NewTable("per_source", append(limitRows(func(p *PerSource) *Bucket { return &p.Bucket }, "each source"),
	yamlcheck.Nested("key", "the source address is masked to these lengths (one bucket per /N or /M)", keyTable,
		func(p *PerSource) *KeyBits { return &p.Key }))...)

// perPrefixTable is per_prefix: the rule's sources together.
var perPrefixTable = yamlcheck.NewTable("per_prefix", append(limitRows(func(p *PerPrefix) *Bucket { return &p.Bucket }, "the group"),
	yamlcheck.Func("group", "whole, or {ipv4: N, ipv6: N}",
		"whole: all sources of the rule share one bucket; {ipv4: N, ipv6: M}: one bucket per source masked to /N or /M (hashlimit's srcmask); needed with limits",
		parseGroup, formatGroup))...)

// perASNTable is per_asn: one bucket per origin ASN.
var perASNTable = yamlcheck.NewTable("per_asn",
	limitRows(func(b *Bucket) *Bucket { return b }, "each origin ASN (sources with unknown ASN skip it)")...)

func parseGroup(c *yamlcheck.Checker, g *yaml.Node, where string, p *PerPrefix) {
	switch {
	case g.Kind == yaml.ScalarNode && g.Value == "whole":
		p.Whole, p.Derive = true, KeyBits{}
	case g.Kind == yaml.MappingNode:
		p.Whole = false
		var k KeyBits
		if keyTable.ParseAt(c, g, where, &k) != nil && (k.V4 == 0 || k.V6 == 0) {
			c.Errorf(g, "%s needs both ipv4 and ipv6 prefix lengths", where)
		}
		p.Derive = k
	default:
		c.Errorf(g, "%s must be whole or {ipv4: N, ipv6: N}, got %s", where, yamlcheck.KindName(g))
	}
}

func formatGroup(p *PerPrefix) string {
	switch {
	case p.Whole:
		return "whole"
	case p.Derive == (KeyBits{}):
		return "none"
	}
	return keyTable.String(&p.Derive)
}

// limitFields are the limit sections of a defaults: or rule mapping whose
// Limits are at *at(s).
func limitFields[S any](at func(s *S) *Limits) []yamlcheck.Field[S] {
	return []yamlcheck.Field[S]{
		yamlcheck.Nested("per_source", "each source's bucket; a rule without it inherits defaults'", perSourceTable, func(s *S) *PerSource { return &at(s).PerSource }).
			Fresh(func(s *S) { at(s).PerSource.Bucket = Bucket{} }),
		yamlcheck.Nested("per_prefix", "one bucket for the rule's sources, or one per group of them; a rule without it inherits defaults'", perPrefixTable,
			func(s *S) *PerPrefix { return &at(s).PerPrefix }).
			Fresh(func(s *S) { at(s).PerPrefix.Bucket = Bucket{} }),
		yamlcheck.Nested("per_asn", "one bucket per origin ASN; a rule without it inherits defaults'", perASNTable, func(s *S) *Bucket { return &at(s).PerASN }).
			Fresh(func(s *S) { at(s).PerASN = Bucket{} }),
		yamlcheck.Val[S, uint32]("reserve", reserve, func(s *S) *uint32 { return &at(s).Reserve },
			"the share of the per_prefix and per_asn bursts only established and validated sources may use; by default 50% where it leaves new sources a packet"),
	}
}

// defaultLimits are the limits before defaults: (no limits, per-source
// keys /32 and /64, the default reserve).
func defaultLimits() Limits {
	return Limits{PerSource: PerSource{Key: KeyBits{V4: 32, V6: 64}}, Reserve: DefaultReserve}
}

// defaultsTable is the defaults: section: the default rule's limits, and
// what rules inherit.
var defaultsTable = yamlcheck.NewTable("defaults", limitFields(func(l *Limits) *Limits { return l })...)

// limits parses the defaults: section on top of base.
func (ps *parser) limits(n *yaml.Node, base Limits) Limits {
	out := base
	f := defaultsTable.Parse(&ps.Checker, n, &out)
	ps.limitChecks(f, "defaults", &out, true)
	return out
}

// limitChecks applies the rules across a limits mapping's fields, after
// the walk (f: its value nodes; out: the limits):
// per_prefix limits need a group, an unwritten reserve is the built-in
// default where it fits (unless defaults: writes one, which rules then
// inherit), and a written one must leave new sources a packet.
func (ps *parser) limitChecks(f map[string]*yaml.Node, where string, out *Limits, isDefaults bool) {
	if n, ok := f["per_prefix"]; ok && out.PerPrefix.IsSet() && !out.PerPrefix.Whole && out.PerPrefix.Derive == (KeyBits{}) {
		where := where + ".per_prefix"
		if isDefaults {
			ps.Errorf(n, "%s has limits but no group; add group: whole (one bucket for all sources) or group: {ipv4: 24, ipv6: 48} (one bucket per /24 and /48)", where)
		} else {
			ps.Errorf(n, "%s has limits but no group, and defaults.per_prefix has none to inherit; add group: whole or group: {ipv4: 24, ipv6: 48}", where)
		}
	}
	explicit := ps.defaultReserveSet && !isDefaults
	if _, ok := f["reserve"]; ok {
		explicit = true
		if isDefaults {
			ps.defaultReserveSet = true
		}
	}
	if !explicit {
		// The built-in default applies where it leaves new sources a packet.
		out.Reserve = implicitReserve(DefaultReserve, out.PerPrefix.Bucket, out.PerASN)
		return
	}
	at := f["reserve"]
	for _, k := range []string{"per_prefix", "per_asn"} {
		if at == nil {
			at = f[k]
		}
	}
	if at != nil {
		ps.checkReserve(at, where+".per_prefix", out.PerPrefix.Bucket, out.Reserve)
		ps.checkReserve(at, where+".per_asn", out.PerASN, out.Reserve)
	}
}

// named is a kind whose messages name the field as name, whatever the
// walker calls it ("rule web action", where the rule's limits are "rule
// web.per_source").
type named[V any] struct {
	yamlcheck.Kind[V]
	name string
}

func (k named[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, _ string) (V, bool) {
	return k.Kind.Parse(c, n, k.name)
}

// ruleTable is one rules: item, called where in messages ("rule web", or
// "the rule at line N" before it has a valid name); ps is the parser whose
// claims the match records (nil: the table is only described).
func ruleTable(ps *parser, where string) *yamlcheck.Table[Rule] {
	enum := func(key string) string { return where + " " + key }
	fields := []yamlcheck.Field[Rule]{
		yamlcheck.Func("name", "text", `1-63 of a-z 0-9 . _ -, starting with a letter or digit; unique; "default" is reserved`,
			func(c *yamlcheck.Checker, n *yaml.Node, _ string, r *Rule) {
				if name, ok := c.Scalar(n, "rule name"); ok {
					if err := checkRuleName(name); err != nil {
						c.Errorf(n, "%v", err)
						return
					}
					r.Name, r.Pos = name, yamlcheck.PosOf(n)
				}
			},
			func(r *Rule) string { return r.Name }).Required("rule needs a name"),
		yamlcheck.Func("match", "mapping: exactly one of prefixes, asns, countries or protocol (below)", "what the rule applies to",
			func(_ *yamlcheck.Checker, n *yaml.Node, _ string, r *Rule) { r.Match = ps.match(n, where) },
			func(r *Rule) string { return describeMatch(r.Match) }).
			Required(where + " needs a match (prefixes, asns, countries or protocol)"),
		yamlcheck.Val[Rule, Action]("action", named[Action]{yamlcheck.Enum[Action]{Values: []Action{ActionLimit, ActionDrop, ActionPass}}, enum("action")},
			func(r *Rule) *Action { return &r.Action }, "limit: the buckets apply; drop, pass: no buckets"),
		yamlcheck.Val[Rule, RuleMode]("mode", named[RuleMode]{yamlcheck.Enum[RuleMode]{Values: []RuleMode{RuleModeInherit, RuleModeEnforce, RuleModeDryRun}}, enum("mode")},
			func(r *Rule) *RuleMode { return &r.Mode }, "inherit: the policy's mode"),
	}
	fields = append(fields, limitFields(func(r *Rule) *Limits { return &r.Limits })...)
	fields = append(fields, yamlcheck.Val[Rule, Scope]("scope", named[Scope]{yamlcheck.Enum[Scope]{Values: []Scope{ScopeHost, ScopeFleet}}, enum("scope")},
		func(r *Rule) *Scope { return &r.Scope }, "fleet: the fleet shares the per_prefix and per_asn budgets (packets, bytes); per_source stays per host"))
	return yamlcheck.NewTable(where, fields...)
}

// checkRuleName refuses the default rule's name and names that are not
// 1-63 of a-z 0-9 . _ -.
func checkRuleName(name string) error {
	switch {
	case name == DefaultRuleName:
		return fmt.Errorf("rule name %q is reserved for the default rule; set its limits under defaults:", name)
	case !ruleNameRE.MatchString(name):
		return fmt.Errorf("rule name %q: use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// ruleWhere names a rules: item in messages: by its name if it has a valid
// one, else by its line.
func ruleWhere(item *yaml.Node) string {
	if n := yamlcheck.Lookup(item, "name"); n != nil && n.Kind == yaml.ScalarNode && !yamlcheck.IsNull(n) && checkRuleName(n.Value) == nil {
		return "rule " + n.Value
	}
	return fmt.Sprintf("the rule at line %d", item.Line)
}

func (ps *parser) rules(n *yaml.Node, defaults Limits) []Rule {
	var out []Rule
	for _, item := range ps.Seq(n, "rules") {
		where := ruleWhere(item)
		r := Rule{Pos: yamlcheck.PosOf(item), Action: ActionLimit, Mode: RuleModeInherit, Scope: ScopeHost, Limits: defaults}
		f := ruleTable(ps, where).ParseIn(&ps.Checker, item, "a rule", where+".", &r)
		if f == nil {
			continue
		}
		if r.Action != ActionLimit {
			for _, k := range []string{"per_source", "per_prefix", "per_asn", "reserve"} {
				if v, ok := f[k]; ok {
					ps.Errorf(v, "%s: %s only applies with action: limit (this rule's action is %s)", where, k, r.Action)
				}
			}
		}
		ps.limitChecks(f, where, &r.Limits, false)
		out = append(out, r)
	}
	return out
}
