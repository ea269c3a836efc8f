package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/asn"
)

func mustParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\n"+src), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func cc(s string) [2]byte { return [2]byte{s[0], s[1]} }

func ent(p string, as uint32, country string) asn.Entry {
	e := asn.Entry{Prefix: netip.MustParsePrefix(p), ASN: as}
	if country != "" {
		e.Country = cc(country)
	}
	return e
}

func factsString(fs []PrefixFact, names map[uint32]string) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "%s rule=%s asn=%d country=%q\n", f.Prefix, names[f.RuleID], f.ASN, strings.TrimRight(f.Country.String(), "\x00"))
	}
	return b.String()
}

func ruleNames(c *Compiled) map[uint32]string {
	m := map[uint32]string{}
	for _, r := range c.Rules {
		m[r.ID] = r.Name
	}
	return m
}

const withASNData = "asn_data: {path: x.tsv}\n"

func TestCompilePrefixes(t *testing.T) {
	tests := []struct {
		name  string
		rules string
		data  []asn.Entry
		want  string
	}{
		{
			name: "no rules and no data: no entries",
		},
		{
			name:  "one prefix rule",
			rules: "rules: [{name: a, match: {prefixes: [10.0.0.0/8]}}]\n",
			want:  "10.0.0.0/8 rule=a asn=0 country=\"\"\n",
		},
		{
			name:  "a nested prefix of the same rule adds nothing",
			rules: "rules: [{name: a, match: {prefixes: [10.0.0.0/8, 10.1.0.0/16]}}]\n",
			want:  "10.0.0.0/8 rule=a asn=0 country=\"\"\n",
		},
		{
			name:  "the most specific prefix rule wins",
			rules: "rules: [{name: a, match: {prefixes: [10.0.0.0/8]}}, {name: b, match: {prefixes: [10.1.0.0/16]}}]\n",
			want:  "10.0.0.0/8 rule=a asn=0 country=\"\"\n10.1.0.0/16 rule=b asn=0 country=\"\"\n",
		},
		{
			name:  "a rule prefix spanning two ASN ranges is split so each keeps its ASN",
			rules: "rules: [{name: a, match: {prefixes: [10.0.0.0/8]}}]\n",
			data:  []asn.Entry{ent("10.1.0.0/16", 1, "DE"), ent("10.2.0.0/16", 2, "FR"), ent("11.0.0.0/8", 3, "US")},
			want: "10.0.0.0/8 rule=a asn=0 country=\"\"\n10.1.0.0/16 rule=a asn=1 country=\"DE\"\n" +
				"10.2.0.0/16 rule=a asn=2 country=\"FR\"\n11.0.0.0/8 rule=default asn=3 country=\"US\"\n",
		},
		{
			name:  "a rule prefix inside an ASN range keeps the ASN",
			rules: "rules: [{name: a, match: {prefixes: [10.1.0.0/16]}}]\n",
			data:  []asn.Entry{ent("10.0.0.0/8", 1, "DE")},
			want:  "10.0.0.0/8 rule=default asn=1 country=\"DE\"\n10.1.0.0/16 rule=a asn=1 country=\"DE\"\n",
		},
		{
			name:  "a rule prefix equal to an ASN range is one entry",
			rules: "rules: [{name: a, match: {prefixes: [10.0.0.0/8]}}]\n",
			data:  []asn.Entry{ent("10.0.0.0/8", 1, "DE")},
			want:  "10.0.0.0/8 rule=a asn=1 country=\"DE\"\n",
		},
		{
			name: "prefix rule beats ASN rule beats country rule beats default",
			rules: withASNData + "rules: [{name: p, match: {prefixes: [10.1.2.0/24]}}, {name: as, match: {asns: [AS1]}}," +
				" {name: de, match: {countries: [DE]}}]\n",
			data: []asn.Entry{ent("10.1.0.0/16", 1, "DE"), ent("10.2.0.0/16", 2, "DE"), ent("10.3.0.0/16", 3, "FR")},
			want: "10.1.0.0/16 rule=as asn=1 country=\"DE\"\n10.1.2.0/24 rule=p asn=1 country=\"DE\"\n" +
				"10.2.0.0/16 rule=de asn=2 country=\"DE\"\n10.3.0.0/16 rule=default asn=3 country=\"FR\"\n",
		},
		{
			name:  "an ASN range equal to its parent's facts is dropped",
			rules: "",
			data:  []asn.Entry{ent("10.0.0.0/8", 1, "DE"), ent("10.1.0.0/16", 1, "DE"), ent("10.2.0.0/16", 2, "DE")},
			want:  "10.0.0.0/8 rule=default asn=1 country=\"DE\"\n10.2.0.0/16 rule=default asn=2 country=\"DE\"\n",
		},
		{
			name:  "an IPv6 rule covering the IPv4-mapped range does not leak into IPv4",
			rules: "rules: [{name: six, match: {prefixes: [\"::/0\"]}}]\n",
			want:  "0.0.0.0/0 rule=default asn=0 country=\"\"\n::/0 rule=six asn=0 country=\"\"\n",
		},
		{
			name:  "IPv4 and IPv6 catch-all rules",
			rules: "rules: [{name: six, match: {prefixes: [\"::/0\"]}}, {name: four, match: {prefixes: [0.0.0.0/0]}}]\n",
			want:  "0.0.0.0/0 rule=four asn=0 country=\"\"\n::/0 rule=six asn=0 country=\"\"\n",
		},
		{
			name:  "IPv6 ASN ranges",
			rules: withASNData + "rules: [{name: as, match: {asns: [64500]}}]\n",
			data:  []asn.Entry{ent("2001:db8::/32", 64500, "NL"), ent("2001:db8:1::/48", 64501, "NL")},
			want:  "2001:db8::/32 rule=as asn=64500 country=\"NL\"\n2001:db8:1::/48 rule=default asn=64501 country=\"NL\"\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Compile(mustParse(t, tc.rules), tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if got := factsString(c.Prefixes, ruleNames(c)); got != tc.want {
				t.Errorf("prefix facts:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestCompileWarnsAboutUnusedASNs(t *testing.T) {
	p := mustParse(t, withASNData+"rules: [{name: as, match: {asns: [7]}}, {name: c, match: {countries: [JP]}}]\n")
	c, err := Compile(p, []asn.Entry{ent("10.0.0.0/8", 1, "DE")})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"rule as: AS7 has no prefixes in the ASN data; the rule matches nothing for it",
		"rule c: country JP has no prefixes in the ASN data; the rule matches nothing for it",
	}
	if !slices.Equal(c.Warnings, want) {
		t.Errorf("warnings = %q", c.Warnings)
	}
}

func TestCompileErrors(t *testing.T) {
	p := mustParse(t, "tables: {prefix_entries: 2}\n")
	_, err := Compile(p, []asn.Entry{ent("10.0.0.0/8", 1, ""), ent("11.0.0.0/8", 2, ""), ent("12.0.0.0/8", 3, "")})
	if !errors.Is(err, ErrTableTooSmall) || !strings.Contains(err.Error(), "tables.prefix_entries is 2 but the policy needs 3 entries") {
		t.Errorf("err = %v", err)
	}
	_, err = Compile(mustParse(t, ""), []asn.Entry{ent("10.0.0.0/8", 1, ""), ent("10.0.0.0/8", 2, "")})
	if err == nil || !strings.Contains(err.Error(), "asn data lists 10.0.0.0/8 twice") {
		t.Errorf("err = %v", err)
	}
}

func TestCompileRulesAndL4(t *testing.T) {
	p := mustParse(t, `
defaults:
  per_source: {packets: 10/s}
  per_prefix: {group: {ipv4: 24, ipv6: 48}, packets: 100/s}
rules:
  - {name: dns, match: {protocol: udp, src_ports: [53, 123], dst_ports: [53]}, per_prefix: {group: whole, bytes: 1Mbit/s}}
  - {name: gre, match: {protocol: icmp}, action: drop}
  - {name: ping, match: {protocol: icmpv6, icmp_types: [128, 129]}}
  - {name: quiet, match: {prefixes: [192.0.2.0/24]}, mode: dry-run, per_source: {key: {ipv4: 28}, packets: 1/min}}
`)
	c, err := Compile(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules) != 5 || c.Rules[0].Name != DefaultRuleName || c.Rules[0].ID != 0 {
		t.Fatalf("rules = %+v", c.Rules)
	}
	def := c.Rules[0]
	if def.PerSource.Packets.Rate != (Rate{10, time.Second}) || def.Aggregate != AggregateDerived || def.AggregateKey != (KeyBits{24, 48}) {
		t.Errorf("default = %+v", def)
	}
	dns := c.Rules[1]
	if dns.Aggregate != AggregateWhole || dns.PerPrefix.Packets.IsSet() || dns.PerPrefix.Bytes.Rate.Count != 125000 {
		t.Errorf("dns = %+v", dns)
	}
	if g := c.Rules[2]; g.Action != ActionDrop || g.PerSource.IsSet() || g.PerPrefix.IsSet() || g.Aggregate != AggregateNone {
		t.Errorf("gre = %+v", g)
	}
	q := c.Rules[4]
	if q.SourceKey != (KeyBits{28, 64}) || q.Aggregate != AggregateDerived || q.AggregateKey != (KeyBits{24, 48}) || q.Mode != RuleModeDryRun {
		t.Errorf("quiet = %+v", q)
	}
	wantL4 := []L4Entry{
		{Protocol: 1, Dir: PortAny, RuleID: RuleID("gre")},
		{Protocol: 17, Dir: PortSrc, Port: 53, RuleID: RuleID("dns")},
		{Protocol: 17, Dir: PortSrc, Port: 123, RuleID: RuleID("dns")},
		{Protocol: 17, Dir: PortDst, Port: 53, RuleID: RuleID("dns")},
		{Protocol: 58, Dir: PortDst, Port: 128, RuleID: RuleID("ping")},
		{Protocol: 58, Dir: PortDst, Port: 129, RuleID: RuleID("ping")},
	}
	if !slices.Equal(c.L4, wantL4) {
		t.Errorf("l4 = %+v", c.L4)
	}
}

func TestRuleIDsAreStable(t *testing.T) {
	a, _ := Compile(mustParse(t, "rules: [{name: x, match: {prefixes: [10.0.0.0/8]}}, {name: y, match: {prefixes: [11.0.0.0/8]}}]\n"), nil)
	b, _ := Compile(mustParse(t, "rules: [{name: z, match: {protocol: tcp}}, {name: y, match: {prefixes: [12.0.0.0/8]}}]\n"), nil)
	if a.Rules[0].ID != 0 || b.Rules[0].ID != 0 || a.Rules[2].ID != b.Rules[2].ID || a.Rules[2].Name != "y" {
		t.Errorf("ids: %+v / %+v", a.Rules, b.Rules)
	}
	// Pinned so a change to the hash (which would reset every bucket on
	// upgrade) fails loudly.
	if got := RuleID("udp-reflection"); got != 0xee77157e {
		t.Errorf("RuleID(udp-reflection) = %#x", got)
	}
}

func listString(recs []ListRecord) string {
	var b strings.Builder
	l := func(x Listing) string {
		switch {
		case !x.Listed:
			return "-"
		case x.Until.IsZero():
			return "forever"
		}
		return x.Until.Format(time.DateOnly)
	}
	for _, r := range recs {
		fmt.Fprintf(&b, "%s deny=%s allow=%s\n", r.Prefix, l(r.Deny), l(r.Allow))
	}
	return b.String()
}

func TestCompileLists(t *testing.T) {
	tests := []struct {
		name, lists, want string
	}{
		{"empty", "", ""},
		{"an allow under a permanent deny folds away", "{deny: [10.0.0.0/8], allow: [10.1.0.0/16]}",
			"10.0.0.0/8 deny=forever allow=-\n"},
		{"an allow under an expiring deny becomes a deny until then, then an allow",
			"{deny: [{cidr: 10.0.0.0/8, expires: 2026-02-01}], allow: [10.1.0.0/16]}",
			"10.0.0.0/8 deny=2026-02-01 allow=-\n10.1.0.0/16 deny=2026-02-01 allow=forever\n"},
		{"a deny under an allow stays a deny", "{allow: [10.0.0.0/8], deny: [10.1.0.0/16]}",
			"10.0.0.0/8 deny=- allow=forever\n10.1.0.0/16 deny=forever allow=-\n"},
		{"a nested deny that ends sooner adds nothing", "{deny: [10.0.0.0/8, {cidr: 10.1.0.0/16, expires: 2026-02-01}]}",
			"10.0.0.0/8 deny=forever allow=-\n"},
		{"a nested deny that lasts longer stays", "{deny: [{cidr: 10.0.0.0/8, expires: 2026-02-01}, {cidr: 10.1.0.0/16, expires: 2026-03-01}]}",
			"10.0.0.0/8 deny=2026-02-01 allow=-\n10.1.0.0/16 deny=2026-03-01 allow=-\n"},
		{"the same prefix twice keeps the longest listing", "{deny: [{cidr: 10.0.0.0/8, expires: 2026-02-01}, {cidr: 10.0.0.0/8, expires: 2026-03-01}]}",
			"10.0.0.0/8 deny=2026-03-01 allow=-\n"},
		{"the same prefix in both lists: deny wins", "{deny: [10.0.0.0/8], allow: [10.0.0.0/8]}",
			"10.0.0.0/8 deny=forever allow=-\n"},
		{"an IPv6 entry covering the IPv4-mapped range does not leak into IPv4", `{allow: ["::/0"]}`,
			"0.0.0.0/0 deny=- allow=-\n::/0 deny=- allow=forever\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := ""
			if tc.lists != "" {
				src = "lists: " + tc.lists + "\n"
			}
			c, err := Compile(mustParse(t, src), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := listString(c.Lists); got != tc.want {
				t.Errorf("lists:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}
