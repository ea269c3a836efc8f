package netns_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// explainASNData covers only the lab's two /16s: 203.0.113.9 and 127.0.0.1
// are not in it.
const explainASNData = "198.18.0.0\t198.18.255.255\t64501\tZZ\tLEGIT-CLIENTS\n" +
	"198.19.0.0\t198.19.255.255\t64500\tZZ\tATTACKER\n"

const explainPolicy = `lists:
  deny: [127.0.0.0/8]
  allow: [198.18.1.0/24]
defaults:
  per_source: {packets: {rate: 100/s, burst: 100}}
  per_prefix: {group: {ipv4: 24, ipv6: 48}, packets: {rate: 1000/s, burst: 1000}}
  per_asn: {packets: {rate: 5000/s, burst: 5000}}
global:
  packets: {rate: 1M/s, burst: 1M}
rules:
  - name: attacker-asn
    match: {asns: [64500]}
    per_source: {packets: {rate: 1/min, burst: 5}}
  - name: dns-reflection
    match: {protocol: udp, src_ports: [53]}
    per_source: {}
    per_prefix: {group: whole, packets: {rate: 1000/s, burst: 1000}}
`

func (s *scenario) explain(args ...string) control.Explanation {
	s.t.Helper()
	out, err := s.lab.Daemon.Ctl(s.ctx, append([]string{"explain", "-o", "json"}, args...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	var e control.Explanation
	if err := json.Unmarshal(out, &e); err != nil {
		s.t.Fatalf("explain -o json: %v: %s", err, out)
	}
	return e
}

func (s *scenario) ctlText(args ...string) string {
	s.t.Helper()
	out, err := s.lab.Daemon.Ctl(s.ctx, args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return string(out)
}

// bucketOf is the last step of a kind of bucket on the path (its charge,
// when the packet got that far).
func bucketOf(t *testing.T, e control.Explanation, kind string) control.ExplainBucket {
	t.Helper()
	for i := len(e.Buckets) - 1; i >= 0; i-- {
		if b := e.Buckets[i]; b.Kind == kind {
			return b
		}
	}
	t.Fatalf("%s: no %s bucket in %+v", e.IP, kind, e.Buckets)
	return control.ExplainBucket{}
}

// bucketKinds counts the kinds of bucket on the path.
func bucketKinds(e control.Explanation) int {
	kinds := map[string]bool{}
	for _, b := range e.Buckets {
		kinds[b.Kind] = true
	}
	return len(kinds)
}

// TestExplain runs `edgectl explain` and `edgectl asn lookup` against the
// real daemon: lists (policy and run time), rules from an ASN, the
// default and an L4 match, bucket fill before and after a flood from one
// source, and that source's drop samples.
func TestExplain(t *testing.T) {
	s := newScenario(t, 1, attackerNet)
	if err := os.WriteFile(filepath.Join(filepath.Dir(s.lab.PolicyPath()), "ip2asn.tsv"), []byte(explainASNData), 0o644); err != nil {
		t.Fatal(err)
	}
	s.start(explainPolicy)

	// A deny-listed address: the list decides, no rule; and the ASN data
	// does not hold it (not "no ASN data").
	e := s.explain("127.0.0.1")
	if e.Verdict != "drop" || e.Reason != "deny_list" || e.List == nil || e.List.Prefix != netip.MustParsePrefix("127.0.0.0/8") ||
		e.List.Origin != "policy" || e.Rule != nil || len(e.Buckets) != 0 || !e.ASN.Data || e.ASN.Found {
		t.Errorf("explain 127.0.0.1: %+v", e)
	}
	if txt := s.ctlText("asn", "lookup", "127.0.0.1"); strings.Contains(txt, "rule default") || strings.Contains(txt, "no ASN data") ||
		!strings.Contains(txt, "deny-listed by 127.0.0.0/8") || !strings.Contains(txt, "not in the ASN data (2 entries loaded)") {
		t.Errorf("asn lookup 127.0.0.1: %q", txt)
	}
	if txt := s.ctlText("asn", "lookup", "203.0.113.9"); !strings.Contains(txt, "not in the ASN data") || !strings.Contains(txt, "rule default") {
		t.Errorf("asn lookup 203.0.113.9: %q", txt)
	}
	// Allow-listed: passes without buckets.
	if e := s.explain("198.18.1.7"); e.Verdict != "pass" || e.Reason != "allow_list" || e.List == nil || e.List.List != control.Allow || len(e.Buckets) != 0 {
		t.Errorf("explain 198.18.1.7: %+v", e)
	}

	// The default rule, with its three buckets and the global one.
	user := s.lab.Legit[0].Src4
	e = s.explain(user.String())
	if e.Verdict != "pass" || e.Rule == nil || e.Rule.Name != "default" || e.Rule.From != "default" || e.ASN.ASN != 64501 ||
		e.ASN.DataPlaneASN != 64501 || bucketKinds(e) != 4 {
		t.Fatalf("explain %s: %+v", user, e)
	}
	if e.Standing == nil || e.Standing.Standing != "new" || e.Standing.Tracked {
		t.Errorf("explain %s: standing %+v, want new and untracked", user, e.Standing)
	}
	if b := bucketOf(t, e, "per_asn"); b.Key != "AS64501" || b.Packets == nil || b.Packets.Limit != "5k/s burst 5k" || !b.Admits {
		t.Errorf("per_asn bucket: %+v", b)
	}
	if b := bucketOf(t, e, "per_prefix"); b.Key != netip.PrefixFrom(user, 24).Masked().String() {
		t.Errorf("per_prefix bucket: %+v", b)
	}
	// An L4 rule takes UDP from port 53, whatever the prefix says.
	e = s.explain(user.String(), "--proto", "udp", "--sport", "53")
	if e.Rule == nil || e.Rule.Name != "dns-reflection" || e.Rule.From != "l4" || e.Rule.Match != "udp src port 53" ||
		bucketKinds(e) != 3 || bucketOf(t, e, "per_prefix").Key != "whole" {
		t.Errorf("explain %s udp from 53: %+v", user, e)
	}

	// A source of AS64500, charged to the ASN rule: five packets a minute.
	// Flood it, then it is over its own limit, and its drops were sampled.
	a := s.lab.Attackers[0]
	bot := netip.MustParseAddr("198.19.5.5")
	e = s.explain(bot.String())
	if e.Rule == nil || e.Rule.Name != "attacker-asn" || e.Rule.From != "asn" || e.Rule.Match != "AS64500" || e.Verdict != "pass" {
		t.Fatalf("explain %s before the flood: %+v", bot, e)
	}
	if b := bucketOf(t, e, "per_source"); b.Exists || b.Packets.Available != 5 || b.Key != "198.19.5.5/32" {
		t.Errorf("per_source before any packet: %+v", b)
	}
	fr, err := s.lab.Flood(s.ctx, a, trafficgen.Flood{
		Sources: []netip.Prefix{netip.PrefixFrom(bot, 32)}, Distinct: 1, Proto: trafficgen.UDP, Payload: 32,
		Rate: 1000, Count: 500, Duration: 2 * time.Second, Seed: 5,
	})
	if err != nil || fr.Sent != 500 {
		t.Fatalf("flood: %+v, %v", fr, err)
	}
	var got control.Explanation
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		// Samples reach the daemon through the ring buffer: wait for them.
		if got = s.explain(bot.String()); len(got.Samples) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	b := bucketOf(t, got, "per_source")
	if got.Verdict != "drop" || got.Reason != "source_limit" || !b.Exists || b.Admits || b.Packets.Available >= 1 {
		t.Errorf("explain %s after 500 packets at 5/min: verdict %s (%s), per_source %+v", bot, got.Verdict, got.Reason, b)
	}
	if len(got.Samples) == 0 {
		t.Errorf("explain %s: no drop samples after %d drops", bot, fr.Sent-5)
	}
	for _, smp := range got.Samples {
		if smp.Reason != "source_limit" || smp.Rule != "attacker-asn" || smp.Proto != 17 || smp.DPort != 9009 {
			t.Errorf("sample %+v: want source_limit, rule attacker-asn, udp to 9009", smp)
		}
	}
	if !strings.Contains(got.Why, "per_source bucket 198.19.5.5/32 is empty") {
		t.Errorf("why: %q", got.Why)
	}
	txt := s.ctlText("explain", bot.String())
	for _, want := range []string{"198.19.5.5: drop (source_limit)", "attacker-asn (id ", "from asn AS64500",
		"per_source", "last drop samples:", "AS64500 ZZ (198.19.0.0/16)"} {
		if !strings.Contains(txt, want) {
			t.Errorf("explain %s: no %q in\n%s", bot, want, txt)
		}
	}
	report(t, "explain %s after the flood:\n%s", bot, txt)

	// A run-time deny entry takes over, with its origin and reason.
	s.ctlText("deny", "add", bot.String(), "--ttl", "10m", "--reason", "test")
	e = s.explain(bot.String())
	if e.Reason != "deny_list" || e.List == nil || e.List.Origin != "cli" || e.List.Reason != "test" || e.List.Expires == nil || e.Rule != nil {
		t.Errorf("explain %s after deny add: %+v", bot, e)
	}
	if _, err := s.lab.Daemon.Ctl(s.ctx, "explain", "not-an-address"); err == nil {
		t.Error("explain of a bad address succeeded")
	}
	if _, err := s.lab.Daemon.Ctl(s.ctx, "explain", "198.18.0.2", "--sport", "53"); err == nil {
		t.Error("explain with ports and no protocol succeeded")
	}
}
