package policy

import (
	"net/netip"

	"go.yaml.in/yaml/v3"
)

// crossCheck validates what no single field can: names and ids, data the
// rules depend on, and table capacities against what the policy needs.
// tableAt holds the value nodes of the tables: fields the file sets; a
// problem with a capacity the file leaves at its default is reported at the
// section that needs it.
func (ps *parser) crossCheck(p *Policy, root, listsNode, rulesNode *yaml.Node, tableAt map[string]*yaml.Node) {
	at := func(field string, fallback *yaml.Node) *yaml.Node {
		if n, ok := tableAt[field]; ok {
			return n
		}
		if fallback != nil {
			return fallback
		}
		return root
	}
	names := map[string]Pos{}
	ids := map[uint32]string{0: DefaultRuleName}
	rulePrefixes := map[netip.Prefix]bool{}
	for _, r := range p.Rules {
		if r.Name == "" {
			continue
		}
		n := &yaml.Node{Line: r.Pos.Line, Column: r.Pos.Column}
		if prev, dup := names[r.Name]; dup {
			ps.Errorf(n, "duplicate rule name %q; it is already used at line %d:%d", r.Name, prev.Line, prev.Column)
			continue
		}
		names[r.Name] = r.Pos
		id := RuleID(r.Name)
		if other, clash := ids[id]; clash {
			ps.Errorf(n, "rule %q gets the same id (%#x) as rule %q; rename one of them", r.Name, id, other)
		}
		ids[id] = r.Name
		if (r.Match.Kind == MatchASN || r.Match.Kind == MatchCountry) && p.ASNData.Path == "" {
			ps.Errorf(n, "rule %s matches by %s, which needs asn_data: {path: ...} (an iptoasn TSV or .mmdb file)", r.Name, r.Match.Kind)
		}
		for _, pfx := range r.Match.Prefixes {
			rulePrefixes[pfx] = true
		}
	}
	if rulesNode != nil && uint64(len(p.Rules))+1 > uint64(p.Tables.MaxRules) {
		ps.Errorf(at("max_rules", rulesNode), "tables.max_rules is %d but the policy has %d rules plus the default rule; raise it to at least %d",
			p.Tables.MaxRules, len(p.Rules), len(p.Rules)+1)
	}
	if uint64(len(rulePrefixes)) > uint64(p.Tables.PrefixEntries) {
		ps.Errorf(at("prefix_entries", rulesNode), "tables.prefix_entries is %d but the rules name %d prefixes (before ASN data is merged in); raise it",
			p.Tables.PrefixEntries, len(rulePrefixes))
	}
	listPrefixes := map[netip.Prefix]bool{}
	for _, e := range p.Deny {
		listPrefixes[e.Prefix] = true
	}
	for _, e := range p.Allow {
		listPrefixes[e.Prefix] = true
	}
	if uint64(len(listPrefixes)) > uint64(p.Tables.ListEntries) {
		ps.Errorf(at("list_entries", listsNode), "tables.list_entries is %d but the deny and allow lists hold %d distinct prefixes; raise it",
			p.Tables.ListEntries, len(listPrefixes))
	}
}
