package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestLoadExample(t *testing.T) {
	p, err := Load("../../examples/edgeguard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Metrics.Listen != DefaultMetricsListen || p.Mode != ModeEnforce || p.Malformed != VerdictPass {
		t.Errorf("settings = %+v %v %v", p.Metrics, p.Mode, p.Malformed)
	}
	if p.Defaults.PerPrefix.Derive != (KeyBits{V4: 24, V6: 48}) || p.Defaults.PerSource.Key != (KeyBits{V4: 32, V6: 64}) {
		t.Errorf("defaults keys = %+v %+v", p.Defaults.PerSource.Key, p.Defaults.PerPrefix.Derive)
	}
	var refl *Rule
	for i := range p.Rules {
		if p.Rules[i].Name == "udp-reflection" {
			refl = &p.Rules[i]
		}
	}
	if refl == nil {
		t.Fatal("example has no udp-reflection rule")
	}
	if refl.Match.Protocol != 17 || len(refl.Match.SrcPorts) != 4 || !refl.Limits.PerPrefix.Whole {
		t.Errorf("udp-reflection = %+v", refl)
	}
	// The rule leaves per_asn out, so it inherits the default's.
	if refl.Limits.PerASN != p.Defaults.PerASN {
		t.Errorf("udp-reflection per_asn = %+v, want the default's %+v", refl.Limits.PerASN, p.Defaults.PerASN)
	}
}

// TestLoadInvalidReportsEverything checks that every problem in a file is
// reported at once, each with file:line:column and what is allowed.
func TestLoadInvalidReportsEverything(t *testing.T) {
	_, err := Load("testdata/invalid.yaml")
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Load error = %v, want a *ValidationError", err)
	}
	golden(t, "invalid", err.Error()+"\n")
}

func parseString(t *testing.T, src string, files map[string]string) (*Policy, error) {
	t.Helper()
	return Parse("p.yaml", []byte(src), func(name string) ([]byte, error) {
		if s, ok := files[name]; ok {
			return []byte(s), nil
		}
		return nil, errors.New("no such file")
	})
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"empty", "", "p.yaml: empty policy file"},
		{"syntax", "apiVersion: [\n", "p.yaml:1:1: yaml syntax"},
		{"missing version", "mode: enforce\n", "p.yaml:1:1: missing apiVersion; allowed: edgeguard/v1"},
		{"not a mapping", "- a\n", "p.yaml:1:1: the policy must be a mapping, got a list"},
		{"duplicate key", "apiVersion: edgeguard/v1\nmode: enforce\nmode: dry-run\n", `p.yaml:3:1: field "mode" in the policy is already set at line 2`},
		{"unknown field", "apiVersion: edgeguard/v1\nglobal: {packet: 1/s}\n", `p.yaml:2:10: unknown field "packet" in global; allowed: packets, bytes`},
		{"bytes rate for packets", "apiVersion: edgeguard/v1\nglobal: {packets: 1Gbps}\n", `p.yaml:2:19: global.packets: "1Gbps" is a bytes rate; global.packets takes a packets rate`},
		{"group needed", "apiVersion: edgeguard/v1\ndefaults: {per_prefix: {packets: 1/s}}\n", "defaults.per_prefix has limits but no group"},
		{"group half", "apiVersion: edgeguard/v1\ndefaults: {per_prefix: {group: {ipv4: 24}, packets: 1/s}}\n", "needs both ipv4 and ipv6"},
		{"rule group not inherited", "apiVersion: edgeguard/v1\nrules: [{name: r, match: {prefixes: [10.0.0.0/8]}, per_prefix: {packets: 1/s}}]\n", "defaults.per_prefix has none to inherit"},
		{"asn needs data", "apiVersion: edgeguard/v1\nrules: [{name: r, match: {asns: [1]}}]\n", "p.yaml:2:16: rule r matches by asns, which needs asn_data"},
		{"max rules", "apiVersion: edgeguard/v1\ntables: {max_rules: 1}\nrules: [{name: r, match: {prefixes: [10.0.0.0/8]}}]\n", "p.yaml:2:21: tables.max_rules is 1 but the policy has 1 rules plus the default rule; raise it to at least 2"},
		{"prefix table", "apiVersion: edgeguard/v1\ntables: {prefix_entries: 1}\nrules: [{name: r, match: {prefixes: [10.0.0.0/8, 11.0.0.0/8]}}]\n", "tables.prefix_entries is 1 but the rules name 2 prefixes"},
		{"list table", "apiVersion: edgeguard/v1\ntables: {list_entries: 1}\nlists: {deny: [10.0.0.0/8, 11.0.0.0/8]}\n", "tables.list_entries is 1 but the deny and allow lists hold 2"},
		{"ipv4 direct chunks zero", "apiVersion: edgeguard/v1\ntables: {ipv4_direct_chunks: 0}\n", `p.yaml:2:30: tables.ipv4_direct_chunks "0" must be a whole number from 1 to 67108864`},
		{"ipv4 direct chunks too many", "apiVersion: edgeguard/v1\ntables:\n  ipv4_direct_chunks: 67108865\n", `p.yaml:3:23: tables.ipv4_direct_chunks "67108865" must be a whole number from 1 to 67108864`},
		{"ipv4 direct chunks not a number", "apiVersion: edgeguard/v1\ntables: {ipv4_direct_chunks: 1M}\n", `p.yaml:2:30: tables.ipv4_direct_chunks "1M" must be a whole number`},
		{"ipv4 direct chunks misspelt", "apiVersion: edgeguard/v1\ntables: {ipv4_direct_chunk: 1}\n", `p.yaml:2:10: unknown field "ipv4_direct_chunk" in tables; allowed: per_source_entries, aggregate_entries, prefix_entries, list_entries, max_rules, ipv4_direct_chunks`},
		{"list file errors", "apiVersion: edgeguard/v1\nlists: {deny: [{file: d.txt}]}\n", "d.txt:2:1: bad CIDR \"x\""},
		{"list file missing", "apiVersion: edgeguard/v1\nlists: {deny: [{file: nope.txt}]}\n", `p.yaml:2:23: lists.deny file "nope.txt": no such file`},
		{"file with expiry", "apiVersion: edgeguard/v1\nlists: {deny: [{file: ok.txt, expires: 2026-01-01}]}\n", "expires applies to a cidr entry, not to a file"},
		{"dup interface", "apiVersion: edgeguard/v1\ninterfaces: [eth0, {name: eth0}]\n", `p.yaml:2:27: interface "eth0" is already listed at line 2`},
		{"same l4 any", "apiVersion: edgeguard/v1\nrules: [{name: a, match: {protocol: ICMP}}, {name: b, match: {protocol: icmp}}]\n", "protocol icmp (without ports) is already matched by rule a"},
		{"icmp type range", "apiVersion: edgeguard/v1\nrules: [{name: a, match: {protocol: icmp, icmp_types: [8, 256]}}]\n", `rule a match icmp type "256" must be a whole number from 0 to 255`},
		{"icmp types on tcp", "apiVersion: edgeguard/v1\nrules: [{name: a, match: {protocol: tcp, icmp_types: [8]}}]\n", "icmp_types apply to icmp and icmpv6, not tcp"},
		{"sctp", "apiVersion: edgeguard/v1\nrules: [{name: a, match: {protocol: sctp}}]\n", `unknown protocol "sctp"; allowed: tcp, udp, icmp, icmpv6`},
		{"metrics port", "apiVersion: edgeguard/v1\nmetrics: {listen: '127.0.0.1:0'}\n", "want host:port"},
		{"asn_data path", "apiVersion: edgeguard/v1\nasn_data: {format: mmdb}\n", "asn_data needs a path"},
		{"asn_data format", "apiVersion: edgeguard/v1\nasn_data: {path: a.csv, format: csv}\n", `asn_data.format "csv" is not allowed; allowed: iptoasn, mmdb`},
		{"empty prefixes", "apiVersion: edgeguard/v1\nrules: [{name: a, match: {prefixes: []}}]\n", "rule a match prefixes is empty"},
		{"no match", "apiVersion: edgeguard/v1\nrules: [{name: a}]\n", "rule a needs a match"},
		{"alias ok but field bad", "apiVersion: edgeguard/v1\nx: &l {packets: 1/s}\n", `unknown field "x"`},
	}
	files := map[string]string{"d.txt": "10.0.0.0/8\nx\n", "ok.txt": "10.0.0.0/8\n"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseString(t, tc.src, files)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseValid(t *testing.T) {
	src := `apiVersion: edgeguard/v1
mode: dry-run
malformed: drop
clock: coarse
base: &lim {rate: 10/s, burst: 20}
defaults:
  per_prefix: {group: whole, packets: 1k/s}
rules:
  - name: by-asn
    match: {asns: [AS64500, as64501, 64502]}
    mode: enforce
  - name: by-country
    match: {countries: [de, FR]}
    action: drop
  - name: tcp
    match: {protocol: TCP, dst_ports: 22, src_ports: [22]}
    per_source: {key: {ipv6: 56}, packets: {rate: 1/s}}
    per_prefix: {packets: 5/s}
lists:
  deny:
    - 192.0.2.1
    - {cidr: 2001:db8::/32, expires: 2026-12-31}
    - {file: list.txt}
asn_data: {path: /data/asn.mmdb}
metrics: {listen: ""}
l7:
  anything: [goes, here]
`
	// The alias-defining key "base" is unknown, so drop it for the valid case.
	src = strings.Replace(src, "base: &lim {rate: 10/s, burst: 20}\n", "", 1)
	p, err := parseString(t, src, map[string]string{"list.txt": "# c\n203.0.113.0/24\n"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != ModeDryRun || p.Malformed != VerdictDrop || p.Clock != ClockCoarse || p.Metrics.Listen != "" || p.ASNData.Format != ASNFormatMMDB {
		t.Errorf("settings: %v %v %v %q %v", p.Mode, p.Malformed, p.Clock, p.Metrics.Listen, p.ASNData.Format)
	}
	if got := p.Rules[0].Match.ASNs; len(got) != 3 || got[0] != 64500 || got[2] != 64502 {
		t.Errorf("asns = %v", got)
	}
	if got := p.Rules[1].Match.Countries; len(got) != 2 || got[0].String() != "DE" {
		t.Errorf("countries = %v", got)
	}
	tcp := p.Rules[2]
	if tcp.Match.Protocol != 6 || len(tcp.Match.DstPorts) != 1 || tcp.Match.SrcPorts[0] != 22 {
		t.Errorf("tcp match = %+v", tcp.Match)
	}
	if tcp.Limits.PerSource.Key != (KeyBits{V4: 32, V6: 56}) || tcp.Limits.PerSource.Packets.Burst != 1 {
		t.Errorf("tcp per_source = %+v", tcp.Limits.PerSource)
	}
	if !tcp.Limits.PerPrefix.Whole || tcp.Limits.PerPrefix.Packets.Rate.Count != 5 {
		t.Errorf("tcp per_prefix = %+v (group is inherited from defaults)", tcp.Limits.PerPrefix)
	}
	if len(p.Deny) != 3 || p.Deny[1].Expires.Format("2006-01-02") != "2026-12-31" || p.Deny[2].Source != "list.txt:2:1" {
		t.Errorf("deny = %+v", p.Deny)
	}
	if p.L7 == nil || p.L7.Line != 26 {
		t.Errorf("l7 node = %+v, want kept with its position", p.L7)
	}
}

// TestTablesIPv4DirectChunks: the IPv4 direct table's budget is a tables:
// field like the map sizes, defaulting to the data plane's default.
func TestTablesIPv4DirectChunks(t *testing.T) {
	p, err := parseString(t, "apiVersion: edgeguard/v1\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Tables.IPv4DirectChunks; got != 1<<18 {
		t.Errorf("default ipv4_direct_chunks = %d, want %d", got, 1<<18)
	}
	p, err = parseString(t, "apiVersion: edgeguard/v1\ntables: {max_rules: 8, ipv4_direct_chunks: 4096}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Tables.IPv4DirectChunks != 4096 || p.Tables.MaxRules != 8 || p.Tables.PrefixEntries != DefaultTables().PrefixEntries {
		t.Errorf("tables = %+v", p.Tables)
	}
}

func TestParseCIDRList(t *testing.T) {
	src := "# header\n10.0.0.0/8\n  192.0.2.1  # host\n\n2001:db8::/32\nbad\n10.0.0.1/8\n1.2.3.4 5.6.7.8\n"
	_, err := ParseCIDRList("l.txt", strings.NewReader(src))
	want := "invalid policy l.txt: 3 problems:\n" +
		"  l.txt:6:1: bad CIDR \"bad\": want an address/length like 192.0.2.0/24 or 2001:db8::/32\n" +
		"  l.txt:7:1: bad CIDR \"10.0.0.1/8\": host bits are set below the /8 mask; did you mean 10.0.0.0/8?\n" +
		"  l.txt:8:1: want one CIDR per line, got \"1.2.3.4 5.6.7.8\""
	if err == nil || err.Error() != want {
		t.Errorf("error =\n%v\nwant\n%s", err, want)
	}
	got, err := ParseCIDRList("l.txt", strings.NewReader("# header\n10.0.0.0/8\n  192.0.2.1  # host\n\n2001:db8::/32\n"))
	if err != nil || len(got) != 3 || got[1].Prefix.String() != "192.0.2.1/32" || got[1].Source != "l.txt:3:3" {
		t.Errorf("ParseCIDRList = %+v, %v", got, err)
	}
}

func TestEmptySectionRemovesInheritedLimits(t *testing.T) {
	p, err := parseString(t, `apiVersion: edgeguard/v1
defaults: {per_source: {packets: 10/s}, per_asn: {packets: 100/s}}
rules: [{name: r, match: {prefixes: [10.0.0.0/8]}, per_source: {}}]
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Rules[0]
	if r.Limits.PerSource.IsSet() || r.Limits.PerSource.Key != (KeyBits{32, 64}) || !r.Limits.PerASN.IsSet() {
		t.Errorf("rule limits = %+v", r.Limits)
	}
	if _, err := parseString(t, "apiVersion: edgeguard/v1\nglobal: {packets: 100}\n", nil); err == nil ||
		!strings.Contains(err.Error(), `p.yaml:2:19: global.packets: rate "100" needs a unit, e.g. 100/s (packets) or 100Mbit/s (bits)`) {
		t.Errorf("unitless rate: %v", err)
	}
}

func TestEmptySectionsAreAllowed(t *testing.T) {
	p, err := parseString(t, "apiVersion: edgeguard/v1\ninterfaces:\ndefaults:\nlists:\n  deny:\n  allow:\nrules:\ntables:\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 0 || len(p.Deny) != 0 || p.Tables != DefaultTables() || p.Defaults.PerSource.Key != (KeyBits{32, 64}) {
		t.Errorf("policy = %+v", p)
	}
	if _, err := parseString(t, "apiVersion: edgeguard/v1\nrules: [{name: a, match: {prefixes: }}]\n", nil); err == nil ||
		!strings.Contains(err.Error(), "rule a match prefixes is empty") {
		t.Errorf("empty prefixes: %v", err)
	}
}

// TestInterfacesWalked: an interface is a bare name or {name, xdp_mode};
// an empty or missing name, a bad mode and an unknown key are refused.
func TestInterfacesWalked(t *testing.T) {
	for body, want := range map[string]string{
		"interfaces: [eth0, {name: eth1, xdp_mode: native}]": "",
		"interfaces: [{name: \"\"}]":                         "is not a Linux interface name",
		"interfaces: [{xdp_mode: native}]":                   "interface needs a name",
		"interfaces: [{name: [a]}]":                          "interface name must be a single value",
		"interfaces: [{name: eth0, xdp_mode: turbo}]":        `xdp_mode "turbo" is not allowed`,
		"interfaces: [{name: eth0, mtu: 9000}]":              `unknown field "mtu" in an interface`,
		"interfaces: [eth0, {name: eth0}]":                   "already listed",
	} {
		p, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\n"+body+"\n"), nil)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", body, err)
		case want == "" && (len(p.Interfaces) != 2 || p.Interfaces[1].XDPMode != XDPNative || p.Interfaces[0].XDPMode != XDPAuto):
			t.Errorf("%s: %+v", body, p.Interfaces)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}
