package policy

import (
	"strings"
	"testing"
	"time"
)

func parseFleet(t *testing.T, doc string) (*Policy, error) {
	t.Helper()
	return Parse("/etc/edgeguard/p.yaml", []byte("apiVersion: edgeguard/v1\n"+doc), nil)
}

const fleetASNData = "asn_data: {path: /var/lib/asn.tsv}\n"

func TestFleetSection(t *testing.T) {
	p, err := parseFleet(t, fleetASNData+`fleet:
  name: edge-eu
  host_id: edge-1.fra
  interval: 500ms
  floor: 5%
  lists: false
  redis:
    addrs: ["198.18.0.10:6379", "198.18.0.11:6379", "[fd00::12]:6379"]
    username: edgeguard
    password_file: redis.pass
    timeout: 300ms
    tls: {ca_file: /etc/ssl/ca.pem, server_name: redis.internal}
rules:
  - name: bots
    match: {asns: [64500]}
    scope: fleet
    per_asn: {packets: 1000/s}
  - name: local
    match: {asns: [64501]}
    per_asn: {packets: 1000/s}
`)
	if err != nil {
		t.Fatal(err)
	}
	f := p.Fleet
	if f == nil || f.Name != "edge-eu" || f.HostID != "edge-1.fra" || f.Interval != 500*time.Millisecond || f.Lists || f.Floor != 50_000 {
		t.Fatalf("fleet = %+v", f)
	}
	r := f.Redis
	if len(r.Addrs) != 3 || !r.Cluster || r.Username != "edgeguard" || r.PasswordFile != "/etc/edgeguard/redis.pass" ||
		r.Timeout != 300*time.Millisecond || r.TLS == nil || r.TLS.CAFile != "/etc/ssl/ca.pem" || r.TLS.ServerName != "redis.internal" {
		t.Errorf("redis = %+v tls %+v", r, r.TLS)
	}
	if p.Rules[0].Scope != ScopeFleet || p.Rules[1].Scope != ScopeHost {
		t.Errorf("scopes %q %q", p.Rules[0].Scope, p.Rules[1].Scope)
	}
}

func TestFleetDefaults(t *testing.T) {
	p, err := parseFleet(t, "fleet: {name: f, redis: {addrs: [\"127.0.0.1:6379\"]}}\n")
	if err != nil {
		t.Fatal(err)
	}
	f := p.Fleet
	if f.HostID != "" || f.Interval != DefaultFleetInterval || !f.Lists || f.Floor != DefaultFleetFloor ||
		f.Redis.Cluster || f.Redis.Timeout != DefaultFleetTimeout || f.Redis.TLS != nil {
		t.Errorf("defaults = %+v", f)
	}
	if p, err := parseFleet(t, ""); err != nil || p.Fleet != nil {
		t.Errorf("no fleet section: %+v %v", p, err)
	}
}

func TestFleetInvalid(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"no name", "fleet: {redis: {addrs: [\"127.0.0.1:6379\"]}}", "fleet needs a name"},
		{"bad name", "fleet: {name: \"A B\", redis: {addrs: [\"127.0.0.1:6379\"]}}", "fleet.name"},
		{"bad host", "fleet: {name: f, host_id: \"a:b\", redis: {addrs: [\"127.0.0.1:6379\"]}}", "fleet.host_id"},
		{"no redis", "fleet: {name: f}", "fleet needs redis"},
		{"empty addrs", "fleet: {name: f, redis: {addrs: []}}", "addrs is empty"},
		{"bad addr", "fleet: {name: f, redis: {addrs: [\"redis\"]}}", "want host:port"},
		{"port 0", "fleet: {name: f, redis: {addrs: [\"127.0.0.1:0\"]}}", "want host:port"},
		{"short interval", "fleet: {name: f, interval: 1ms, redis: {addrs: [\"127.0.0.1:6379\"]}}", "fleet.interval"},
		{"long interval", "fleet: {name: f, interval: 1h, redis: {addrs: [\"127.0.0.1:6379\"]}}", "fleet.interval"},
		{"floor 100", "fleet: {name: f, floor: 100%, redis: {addrs: [\"127.0.0.1:6379\"]}}", "fleet.floor"},
		{"lists yes", "fleet: {name: f, lists: yes, redis: {addrs: [\"127.0.0.1:6379\"]}}", "want true or false"},
		{"unknown", "fleet: {name: f, peers: 3, redis: {addrs: [\"127.0.0.1:6379\"]}}", "unknown field \"peers\""},
		{"cluster false", "fleet: {name: f, redis: {addrs: [\"127.0.0.1:1\", \"127.0.0.1:2\"], cluster: false}}", "cluster: false"},
		{"cluster db", "fleet: {name: f, redis: {addrs: [\"127.0.0.1:1\", \"127.0.0.1:2\"], db: 2}}", "only database 0"},
		{"half cert", "fleet: {name: f, redis: {addrs: [\"127.0.0.1:1\"], tls: {cert_file: c.pem}}}", "both cert_file and key_file"},
		{"scope without fleet", "rules: [{name: a, match: {prefixes: [198.18.0.0/24]}, scope: fleet, per_prefix: {packets: 10/s, group: whole}}]",
			"needs a fleet: section"},
		{"scope without budget", "fleet: {name: f, redis: {addrs: [\"127.0.0.1:1\"]}}\nrules: [{name: a, match: {prefixes: [198.18.0.0/24]}, scope: fleet, per_source: {packets: 10/s}}]",
			"no per_prefix or per_asn budget"},
		{"scope drop", "fleet: {name: f, redis: {addrs: [\"127.0.0.1:1\"]}}\nrules: [{name: a, match: {prefixes: [198.18.0.0/24]}, action: drop, scope: fleet}]",
			"no per_prefix or per_asn budget"},
		{"bad scope", "rules: [{name: a, match: {prefixes: [198.18.0.0/24]}, scope: world}]", "scope \"world\" is not allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseFleet(t, c.doc+"\n")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestValidHostID(t *testing.T) {
	for s, want := range map[string]bool{"edge-1": true, "e.fra_2": true, "": false, "-x": false, "a b": false,
		"a/b": false, strings.Repeat("a", 63): true, strings.Repeat("a", 64): false, "{x}": false} {
		if ValidHostID(s) != want {
			t.Errorf("ValidHostID(%q) = %v", s, !want)
		}
	}
}

func TestDiffFleet(t *testing.T) {
	base := "fleet: {name: f, redis: {addrs: [\"127.0.0.1:6379\"]}}\nrules: [{name: r, match: {prefixes: [198.18.0.0/24]}, per_prefix: {group: whole, packets: 10/s}}]\n"
	a, err := parseFleet(t, base)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseFleet(t, strings.Replace(strings.Replace(base, "name: f,", "name: f, interval: 2s,", 1), "per_prefix", "scope: fleet, per_prefix", 1))
	if err != nil {
		t.Fatal(err)
	}
	none, _ := parseFleet(t, "")
	for _, c := range []struct {
		from, to *Policy
		want     []string
	}{
		{a, a, nil},
		{none, a, []string{"+ fleet section: {name: f, host_id: \"\", interval: 1s", "redis: {addrs: [127.0.0.1:6379]"}},
		{a, none, []string{"- fleet section"}},
		{a, b, []string{"~ fleet interval 1s -> 2s\n~ rule r scope host -> fleet\n"}},
	} {
		got := FormatDiff(DiffSections(c.from, c.to, nil))
		if c.want == nil && got != FormatDiff(nil) {
			t.Errorf("no change: %q", got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("diff %q lacks %q", got, w)
			}
		}
	}
}
