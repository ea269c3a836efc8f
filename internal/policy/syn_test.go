package policy

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

func parseSYN(t *testing.T, section string) (*Policy, error) {
	t.Helper()
	return Parse("p.yaml", []byte("apiVersion: edgeguard/v1\n"+section), nil)
}

func TestSYNSection(t *testing.T) {
	p, err := parseSYN(t, `syn:
  validated_for: 5m
  services:
    - name: api
      listen: ["0.0.0.0:443", "[::]:443", "198.51.100.7:80"]
      protection: always
      auto: {on: 5000/s, off: 1000/s, hold: 1m}
      mss: 1400
      window_scale: 9
      answers: {rate: 100/s, burst: 300, per: {ipv4: 22, ipv6: 40}}
      out_of_state: {rate: 50/s, burst: 100}
    - name: ssh
      listen: ["0.0.0.0:22"]
`)
	if err != nil {
		t.Fatal(err)
	}
	s := p.SYN
	if s == nil || s.ValidatedFor != 5*time.Minute || len(s.Services) != 2 {
		t.Fatalf("syn = %+v", s)
	}
	api := s.Services[0]
	if api.Protection != SYNAlways || len(api.Listen) != 3 || api.Listen[2] != netip.MustParseAddrPort("198.51.100.7:80") {
		t.Errorf("api = %+v", api)
	}
	if api.On.Count != 5000 || api.Off.Count != 1000 || api.Hold != time.Minute {
		t.Errorf("auto = %v %v %v", api.On, api.Off, api.Hold)
	}
	if api.MSS != 1400 || api.MSS6 != 1380 || api.WindowScale != 9 {
		t.Errorf("mss %d mss6 %d ws %d", api.MSS, api.MSS6, api.WindowScale)
	}
	if api.Answers.Rate.Count != 100 || api.Answers.Burst != 300 || api.AnswerPrefix4 != 22 || api.AnswerPrefix6 != 40 {
		t.Errorf("answers = %+v /%d /%d", api.Answers, api.AnswerPrefix4, api.AnswerPrefix6)
	}
	if api.OutOfState.Rate.Count != 50 || api.OutOfState.Burst != 100 {
		t.Errorf("out_of_state = %+v", api.OutOfState)
	}
	ssh := s.Services[1]
	if ssh.Protection != SYNAuto || ssh.MSS != DefaultSYNMSS || ssh.WindowScale != DefaultSYNWindowScale ||
		!ssh.OutOfState.Rate.IsZero() || ssh.AnswerPrefix4 != 24 || ssh.AnswerPrefix6 != 48 {
		t.Errorf("defaults = %+v", ssh)
	}
	if p2, err := parseSYN(t, ""); err != nil || p2.SYN != nil {
		t.Errorf("no syn section: %+v %v", p2, err)
	}
}

// TestSYNSectionRejects: every bad value is reported with its position,
// past each bound.
func TestSYNSectionRejects(t *testing.T) {
	for _, tc := range []struct{ section, want string }{
		{"syn: {services: [{name: a, listen: ['0.0.0.0:443'], protection: on}]}", "protection \"on\" is not allowed"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0']}]}", "is not ADDRESS:PORT"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:0']}]}", "is not ADDRESS:PORT"},
		{"syn: {services: [{name: a, listen: ['[::ffff:1.2.3.4]:80']}]}", "is not ADDRESS:PORT"},
		{"syn: {services: [{name: a, listen: []}]}", "listen needs at least one"},
		{"syn: {services: [{listen: ['0.0.0.0:1']}]}", "needs a name"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], window_scale: 15}]}", "window_scale"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], mss: 535}]}", "mss"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], mss6: 1219}]}", "mss6"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], auto: {on: 10/s, off: 20/s}}]}", "must not be above auto.on"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], auto: {on: 1Mbit/s}}]}", "bytes rate"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], answers: {rate: 1/s, per: {ipv4: 33}}}]}", "answers.per.ipv4"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1'], bogus: 1}]}", "bogus"},
		{"syn: {validated_for: -1s}", "must be between"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1']}, {name: a, listen: ['0.0.0.0:2']}]}", "twice"},
		{"syn: {services: [{name: a, listen: ['0.0.0.0:1']}, {name: b, listen: ['0.0.0.0:1']}]}", "already protected"},
	} {
		_, err := parseSYN(t, tc.section)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.section, err, tc.want)
		}
	}
	var b strings.Builder
	b.WriteString("syn:\n  services:\n")
	for i := range maxSYNServices + 1 {
		b.WriteString("    - {name: s" + strings.Repeat("x", i%3) + strconv.Itoa(i) + ", listen: ['0.0.0.0:" + strconv.Itoa(i+1) + "']}\n")
	}
	if _, err := parseSYN(t, b.String()); err == nil || !strings.Contains(err.Error(), "at most 256") {
		t.Errorf("257 services: %v", err)
	}
}

// TestSYNDiff: the syn: section's presence and its services, one by one.
func TestSYNDiff(t *testing.T) {
	a, err := parseStanding(t, "syn: {services: [{name: web, listen: [\"0.0.0.0:443\"]}]}", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseStanding(t, "syn: {validated_for: 1m, services: [{name: web, listen: [\"0.0.0.0:443\"], mss: 1400}]}", nil)
	if err != nil {
		t.Fatal(err)
	}
	none, _ := parseStanding(t, "", nil)
	got := FormatDiff(DiffSections(a, b, nil))
	for _, want := range []string{"~ syn validated_for 10m0s -> 1m0s\n", "+ syn services {name: web, listen: [0.0.0.0:443], protection: auto",
		"mss: 1400, mss6: 1380", "- syn services {name: web"} {
		if !strings.Contains(got, want) {
			t.Errorf("diff %q lacks %q", got, want)
		}
	}
	if got := FormatDiff(DiffSections(none, a, nil)); !strings.HasPrefix(got, "+ syn section: {validated_for: 10m0s") {
		t.Errorf("new section: %q", got)
	}
	if got := FormatDiff(DiffSections(a, none, nil)); got != "- syn section (SYN cookies off)\n" {
		t.Errorf("removed section: %q", got)
	}
}
