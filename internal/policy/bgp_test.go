package policy

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

const bgpNeighbor = "  neighbors: [{address: 198.18.250.2, as: 64513}]\n"

func TestBGPSection(t *testing.T) {
	p, err := parseFleet(t, `lists: {allow: [198.18.9.0/24]}
bgp:
  local_as: 4200000000
  router_id: 198.18.250.1
  dry_run: false
  community: 64512:666
  max_announcements: 1024
  widths: {ipv4: 24, ipv6: 48}
  forbid: [198.18.8.0/24]
  destinations: [198.18.1.0/24, fd00::10/128]
  uplink: {rate: 10Gbit/s, fraction: 50%}
  blackhole: {ttl: 30s}
  flowspec: {action: rate, rate: 1MB/s}
  neighbors:
    - {address: 198.18.250.2, as: 64513, password_file: bgp.pass, multihop: 255, local_address: 198.18.250.1}
    - {address: "fd00::2", as: 64514, families: [ipv6-flowspec, ipv4-flowspec]}
`)
	if err != nil {
		t.Fatal(err)
	}
	b := p.BGP
	if b == nil || b.LocalAS != 4200000000 || b.RouterID != netip.MustParseAddr("198.18.250.1") || b.DryRun ||
		b.Community != 64512<<16|666 || b.MaxAnnouncements != 1024 || b.Width4 != 24 || b.Width6 != 48 ||
		len(b.Destinations) != 2 || b.Uplink.PerSecond() != 1.25e9 || b.Fraction != 0.5 || b.BlackholeTTL != 30*time.Second ||
		!b.FlowSpec || b.FlowSpecRate.PerSecond() != 1e6 {
		t.Fatalf("bgp = %+v", b)
	}
	n := b.Neighbors
	if len(n) != 2 || n[0].PasswordFile != "/etc/edgeguard/bgp.pass" || n[0].Multihop != 255 ||
		strings.Join(n[0].Families, ",") != "ipv4-unicast,ipv4-flowspec" || strings.Join(n[1].Families, ",") != "ipv6-flowspec,ipv4-flowspec" {
		t.Errorf("neighbors = %+v", n)
	}
	if g := p.BGPGuarded(); len(g) != 2 || g[0].Why != "bgp.forbid" || g[1].Why != "lists.allow" {
		t.Errorf("guarded = %+v", g)
	}
}

func TestBGPDefaults(t *testing.T) {
	p, err := parseFleet(t, "bgp:\n  local_as: 64512\n  router_id: 198.18.250.1\n  destinations: [198.18.1.10/32]\n"+bgpNeighbor)
	if err != nil {
		t.Fatal(err)
	}
	b := p.BGP
	if !b.DryRun || b.Community != 65535<<16|666 || b.MaxAnnouncements != 16 || b.Width4 != 32 || b.Width6 != 128 ||
		!b.Uplink.IsZero() || b.BlackholeTTL != 10*time.Minute || !b.FlowSpec || !b.FlowSpecRate.IsZero() || b.Neighbors[0].Multihop != 1 {
		t.Errorf("defaults = %+v", b)
	}
}

// TestBGPRejects: every knob at and past its bounds, and the
// combinations that cannot work.
func TestBGPRejects(t *testing.T) {
	base := func(extra string) string {
		return "bgp:\n  local_as: 64512\n  router_id: 198.18.250.1\n  destinations: [198.18.1.10/32]\n" + extra + bgpNeighbor
	}
	for _, c := range []struct{ doc, want string }{
		{"bgp: {router_id: 198.18.250.1, flowspec: {auto: false}, neighbors: [{address: 198.18.250.2, as: 1}]}\n", "needs local_as"},
		{"bgp: {local_as: 1, flowspec: {auto: false}, neighbors: [{address: 198.18.250.2, as: 1}]}\n", "needs router_id"},
		{"bgp: {local_as: 1, router_id: 198.18.250.1, flowspec: {auto: false}}\n", "needs neighbors"},
		{"bgp: {local_as: 1, router_id: 198.18.250.1, flowspec: {auto: false}, neighbors: []}\n", "0 neighbors"},
		{"bgp:\n  local_as: 64512\n  router_id: 198.18.250.1\n" + bgpNeighbor, "needs destinations"},
		{base("  local_as: 0\n"), "already"}, // duplicate key
		{strings.Replace(base(""), "64512", "0", 1), "bgp.local_as"},
		{strings.Replace(base(""), "64512", "4294967296", 1), "bgp.local_as"},
		{strings.Replace(base(""), "64512", "23456", 1), "AS_TRANS"},
		{strings.Replace(base(""), "64512", "-1", 1), "bgp.local_as"},
		{strings.Replace(base(""), "198.18.250.1", "fd00::1", 1), "router_id"},
		{strings.Replace(base(""), "198.18.250.1", "0.0.0.0", 1), "router_id"},
		{base("  community: 65536:666\n"), "community"},
		{base("  community: 666\n"), "community"},
		{base("  community: \"65535:\"\n"), "community"},
		{base("  max_announcements: 0\n"), "max_announcements"},
		{base("  max_announcements: 1025\n"), "max_announcements"},
		{base("  widths: {ipv4: 33}\n"), "widths.ipv4"},
		{base("  widths: {ipv4: 7}\n"), "widths.ipv4"},
		{base("  widths: {ipv6: 129}\n"), "widths.ipv6"},
		{base("  widths: {ipv6: 15}\n"), "widths.ipv6"},
		{base("  widths: {ipv5: 24}\n"), "ipv5"},
		{strings.Replace(base(""), "198.18.1.10/32", "198.18.1.0/24", 1), "wider than bgp.widths"},
		{strings.Replace(base(""), "198.18.1.10/32", "198.18.1.10/24", 1), "host bits"},
		{strings.Replace(base(""), "198.18.1.10/32", "\"::ffff:198.18.1.10/128\"", 1), "IPv4-mapped"},
		{strings.Replace(base(""), "[198.18.1.10/32]", "[198.18.1.10/32, 198.18.1.10/32]", 1), "twice"},
		{base("  forbid: [198.18.1.0/24]\n"), "overlaps 198.18.1.0/24 (bgp.forbid)"},
		{"lists: {allow: [198.18.1.0/24]}\n" + base(""), "overlaps 198.18.1.0/24 (lists.allow)"},
		{"lists: {protected: [198.18.0.0/16]}\n" + base(""), "(lists.protected)"},
		{base("  uplink: {fraction: 50%}\n"), "needs rate"},
		{base("  uplink: {rate: 10k/s}\n"), "bits or bytes"},
		{base("  uplink: {rate: 10Gbps, fraction: 0%}\n"), "fraction"},
		{base("  uplink: {rate: 10Gbps, fraction: 101%}\n"), "fraction"},
		{base("  uplink: {rate: 100Tbit/s}\n"), "80Tbit/s"},
		{base("  blackhole: {ttl: 9s}\n"), "blackhole.ttl"},
		{base("  blackhole: {ttl: 169h}\n"), "blackhole.ttl"},
		{base("  flowspec: {action: rate}\n"), "needs rate"},
		{base("  flowspec: {action: discard, rate: 1MB/s}\n"), "for action: rate"},
		{base("  flowspec: {action: redirect}\n"), "flowspec.action"},
		{base("  flowspec: {action: rate, rate: 100/s}\n"), "bits or bytes"},
		{base("  flowspec: {auto: yes}\n"), "true or false"},
		{base("  dry_run: 1\n"), "true or false"},
		{base("  bogus: 1\n"), "bogus"},
		{strings.Replace(base(""), "as: 64513", "as: 0", 1), "neighbor as"},
		{strings.Replace(base(""), "as: 64513}", "as: 64513, multihop: 0}", 1), "multihop"},
		{strings.Replace(base(""), "as: 64513}", "as: 64513, multihop: 256}", 1), "multihop"},
		{strings.Replace(base(""), "as: 64513}", "as: 64513, families: []}", 1), "families: empty"},
		{strings.Replace(base(""), "as: 64513}", "as: 64513, families: [l2vpn-evpn]}", 1), "not allowed"},
		{strings.Replace(base(""), "as: 64513}", "as: 64513, families: [ipv4-unicast, ipv4-unicast]}", 1), "twice"},
		{strings.Replace(base(""), "as: 64513}", "as: 64513, local_address: \"fd00::1\"}", 1), "different families"},
		{strings.Replace(base(""), "198.18.250.2", "224.0.0.1", 1), "unicast"},
		{strings.Replace(base(""), "198.18.250.2", "\"fe80::1%eth0\"", 1), "unicast"},
		{strings.Replace(base(""), "198.18.250.2", "0.0.0.0", 1), "unicast"},
		{strings.Replace(base(""), "{address: 198.18.250.2, as: 64513}", "{address: 198.18.250.2, as: 64513}, {address: 198.18.250.2, as: 64514}", 1), "twice"},
		{strings.Replace(base(""), "{address: 198.18.250.2, as: 64513}", "{as: 64513}", 1), "needs address"},
		{strings.Replace(base(""), "{address: 198.18.250.2, as: 64513}", strings.Repeat("{address: 198.18.250.2, as: 64513}, ", 17)+"{address: 198.18.250.3, as: 1}", 1), "want 1 to 16"},
	} {
		_, err := parseFleet(t, c.doc)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s\n  err = %v, want it to contain %q", c.doc, err, c.want)
		}
	}
}

func TestBGPDiff(t *testing.T) {
	doc := "bgp:\n  local_as: 64512\n  router_id: 198.18.250.1\n  destinations: [198.18.1.10/32]\n" + bgpNeighbor
	a, err := parseFleet(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseFleet(t, strings.Replace(doc, "64512", "64515", 1))
	if err != nil {
		t.Fatal(err)
	}
	none, _ := parseFleet(t, "")
	d := &differ{}
	d.bgp(a.BGP, b.BGP)
	d.bgp(none.BGP, a.BGP)
	d.bgp(a.BGP, none.BGP)
	var out string
	for _, c := range d.out {
		out += string(c.Op) + " " + c.Text + "\n"
	}
	for _, want := range []string{"AS64512", "AS64515", "+ bgp section", "- bgp section"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff %q: want %q", out, want)
		}
	}
}
