package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func parseStanding(t *testing.T, body string, files map[string]string) (*Policy, error) {
	t.Helper()
	read := func(name string) ([]byte, error) {
		if s, ok := files[name]; ok {
			return []byte(s), nil
		}
		return nil, errors.New("no such file")
	}
	return Parse("p.yaml", []byte("apiVersion: edgeguard/v1\n"+body), read)
}

func TestStandingDefaults(t *testing.T) {
	p, err := parseStanding(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Standing.EstablishedAfter != 30*time.Second || p.Standing.Penalty != 5*time.Minute || p.Standing.L7Promotion.Enabled ||
		p.Standing.L7Promotion.Rate != (Rate{Count: 100, Per: time.Second}) || p.Standing.L7Promotion.When != PromoteAuthenticated {
		t.Errorf("standing defaults: %+v", p.Standing)
	}
	if p.GlobalReserve != DefaultReserve || p.Defaults.Reserve != DefaultReserve {
		t.Errorf("reserve defaults: global %d, defaults %d", p.GlobalReserve, p.Defaults.Reserve)
	}
}

func TestStandingFields(t *testing.T) {
	p, err := parseStanding(t, `
global: {packets: 3000/s, reserve: 12.5%}
defaults:
  reserve: 40%
  per_prefix: {packets: 1000/s, group: {ipv4: 24, ipv6: 48}}
standing:
  established_after: 45s
  penalty: 10m
  known_good: [198.51.100.0/24, {file: kg.txt}, 198.51.100.0/24]
  l7_promotion: {enabled: true, rate: 20/s, when: authenticated}
rules:
  - name: a
    match: {prefixes: [203.0.113.0/24]}
    reserve: 0
  - name: b
    match: {prefixes: [192.0.2.0/24]}
`, map[string]string{"kg.txt": "# customers\n2001:db8::/32\n"})
	if err != nil {
		t.Fatal(err)
	}
	if p.GlobalReserve != 125_000 || p.Defaults.Reserve != 400_000 || p.Rules[0].Limits.Reserve != 0 || p.Rules[1].Limits.Reserve != 400_000 {
		t.Errorf("reserves: global %d defaults %d a %d b %d", p.GlobalReserve, p.Defaults.Reserve, p.Rules[0].Limits.Reserve, p.Rules[1].Limits.Reserve)
	}
	want := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if len(p.Standing.KnownGood) != 2 || p.Standing.KnownGood[0] != want[0] || p.Standing.KnownGood[1] != want[1] {
		t.Errorf("known_good %v, want %v", p.Standing.KnownGood, want)
	}
	if p.Standing.EstablishedAfter != 45*time.Second || p.Standing.Penalty != 10*time.Minute ||
		!p.Standing.L7Promotion.Enabled || p.Standing.L7Promotion.Rate.Count != 20 || p.Standing.L7Promotion.When != PromoteAuthenticated {
		t.Errorf("standing: %+v", p.Standing)
	}
	c, err := Compile(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.GlobalReserve != 125_000 || c.Rules[0].Reserve != 400_000 || c.Rules[1].Reserve != 0 || c.Standing.EstablishedAfter != 45*time.Second {
		t.Errorf("compiled: global %d, rules %d %d, standing %+v", c.GlobalReserve, c.Rules[0].Reserve, c.Rules[1].Reserve, c.Standing)
	}
}

// TestStandingUsualRateFields: the usual rate's knobs, their defaults, and
// 0/off turning them off; compiled to the data plane's fixed point.
func TestStandingUsualRateFields(t *testing.T) {
	d := DefaultStanding()
	if d.RateHistory != 10*time.Minute || d.JumpFactor != 4 || d.JumpMin.PerSecond() != 10 {
		t.Errorf("defaults: %+v", d)
	}
	for _, tc := range []struct {
		body    string
		history time.Duration
		factor  float64
		min     float64
	}{
		{"standing: {rate_history: 1h, jump_factor: 2.5, jump_min: 50/s}", time.Hour, 2.5, 50},
		{"standing: {rate_history: off}", 0, 4, 10},
		{"standing: {rate_history: 0, jump_factor: 3}", 0, 3, 10},
		{"standing: {jump_factor: off}", 10 * time.Minute, 0, 10},
		{"standing: {jump_factor: 0, jump_min: 0}", 10 * time.Minute, 0, 0},
	} {
		p, err := parseStanding(t, tc.body, nil)
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if s := p.Standing; s.RateHistory != tc.history || s.JumpFactor != tc.factor || s.JumpMin.PerSecond() != tc.min {
			t.Errorf("%s: %+v", tc.body, s)
		}
	}
}

// TestStandingPersonalBudget: standing.personal_budget's defaults, its
// fields, off, and its bounds.
func TestStandingPersonalBudget(t *testing.T) {
	if d := DefaultStanding(); d.PersonalHeadroom != 2 || d.PersonalDefault.PerSecond() != 20 || d.PersonalBurstSeconds != 2 {
		t.Errorf("defaults: headroom %v, default %v/s", d.PersonalHeadroom, d.PersonalDefault.PerSecond())
	}
	for _, tc := range []struct {
		body     string
		headroom float64
		def      float64
		err      string
	}{
		{"standing: {personal_budget: {headroom: 3, default: 50/s}}", 3, 50, ""},
		{"standing: {personal_budget: {headroom: 1.5}}", 1.5, 20, ""},
		{"standing: {personal_budget: {default: 5/s}}", 2, 5, ""},
		{"standing: {personal_budget: off}", 0, 20, ""},
		{"standing: {personal_budget: on}", 0, 0, "want off or"},
		{"standing: {personal_budget: {headroom: 0.5}}", 0, 0, "between 1 and 100"},
		{"standing: {personal_budget: {headroom: 101}}", 0, 0, "between 1 and 100"},
		{"standing: {personal_budget: {default: 1/min}}", 0, 0, "want 1/s to"},
		{"standing: {personal_budget: {default: 2M/s}}", 0, 0, "want 1/s to"},
		{"standing: {personal_budget: {default: 1MB/s}}", 0, 0, "packets per time"},
		{"standing: {personal_budget: {burst: 3}}", 0, 0, "unknown field"},
		{"standing: {personal_budget: {burst_seconds: 0}}", 0, 0, "from 1 to 60"},
		{"standing: {personal_budget: {burst_seconds: 61}}", 0, 0, "from 1 to 60"},
		{"standing: {personal_budget: {burst_seconds: 1.5}}", 0, 0, "whole number"},
	} {
		p, err := parseStanding(t, tc.body, nil)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.body, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if s := p.Standing; s.PersonalHeadroom != tc.headroom || s.PersonalDefault.PerSecond() != tc.def {
			t.Errorf("%s: headroom %v default %v/s, want %v and %v/s", tc.body, s.PersonalHeadroom, s.PersonalDefault.PerSecond(), tc.headroom, tc.def)
		}
	}
}

func TestStandingRejects(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"global: {packets: 10/s, reserve: 100%}", "must be below 100%"},
		{"global: {packets: 10/s, reserve: 150%}", "must be below 100%"},
		{"global: {packets: 10/s, reserve: -5%}", "percentage"},
		{"global: {packets: 10/s, reserve: 50}", "percentage of the burst"},
		{"global: {packets: 10/s, reserve: 1.23456%}", "at most 4 decimals"},
		{"global: {packets: {rate: 10/s, burst: 1}, reserve: 1%}", "leaves new sources no packet"},
		{"global: {packets: {rate: 10/s, burst: 2}, reserve: 50%}", ""},
		{"global: {packets: {rate: 10/s, burst: 2}, reserve: 50.01%}", "leaves new sources no packet"},
		{"global: {bytes: {rate: 1MB/s, burst: 2000}, reserve: 50%}", "1,500-byte"},
		{"defaults: {reserve: 99.9999%, per_asn: {packets: {rate: 100/s, burst: 100}}}", "no packet"},
		{"defaults: {reserve: 50%}\nrules: [{name: r, match: {prefixes: [192.0.2.0/24]}, per_asn: {packets: {rate: 1/s, burst: 1}}}]", "no packet"},
		{"standing: {established_after: 0s}", "between"},
		{"standing: {established_after: 8d}", "want a duration"},
		{"standing: {established_after: 200h}", "between"},
		{"standing: {penalty: soon}", "want a duration"},
		{"standing: {known_good: [10.0.0.1/8]}", "host bits"},
		{"standing: {known_good: [{file: missing.txt}]}", "missing.txt"},
		{"standing: {known_good: [{path: x}]}", "unknown field"},
		{"standing: {l7_promotion: {enabled: yes}}", "want true or false"},
		{"standing: {l7_promotion: {rate: 1Mbit/s}}", "promotions per time"},
		{"standing: {l7_promotion: {when: authenticated}}", ""},
		{"standing: {l7_promotion: {when: authenticated}}", ""},
		{"standing: {l7_promotion: {when: route_passed}}", "route_passed was removed"},
		{"standing: {l7_promotion: {when: Authenticated}}", "allowed: authenticated"},
		{"standing: {l7_promotion: {when: \"\"}}", "allowed: authenticated"},
		{"standing: {l7_promotion: {when: [authenticated]}}", "standing.l7_promotion.when"},
		{"standing: {colour: red}", "unknown field"},
		{"standing: {rate_history: 9s}", "between"},
		{"standing: {rate_history: 25h}", "between"},
		{"standing: {rate_history: soon}", "want a duration"},
		{"standing: {rate_history: 10s, jump_factor: 1.5, jump_min: 1000000/s}", ""},
		{"standing: {rate_history: 24h, jump_factor: 1000}", ""},
		{"standing: {jump_factor: 1.49}", "between"},
		{"standing: {jump_factor: 1001}", "between"},
		{"standing: {jump_factor: -1}", "between"},
		{"standing: {jump_factor: lots}", "want a number"},
		{"standing: {jump_min: 1000001/s}", "at most"},
		{"standing: {jump_min: 1Mbit/s}", "packets per time"},
		{"standing: {jump_min: fast}", "standing.jump_min"},
		{"rules: [{name: d, action: drop, match: {prefixes: [192.0.2.0/24]}, reserve: 10%}]", "only applies with action: limit"},
	} {
		_, err := parseStanding(t, tc.body, nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}

func TestReserveRoundTrip(t *testing.T) {
	for _, s := range []string{"0", "50%", "12.5%", "0.0001%", "99.9999%"} {
		r, err := ParseReserve(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if got := FormatReserve(r); got != s {
			t.Errorf("%s -> %d -> %s", s, r, got)
		}
	}
}

// TestImplicitReserveFits: the built-in 50% applies only where it leaves new
// sources a packet; a small burst gets no reserve rather than an error (a
// policy that loaded before reserves existed still loads and admits).
func TestImplicitReserveFits(t *testing.T) {
	p, err := parseStanding(t, `
global: {packets: {rate: 1/s, burst: 1}}
defaults:
  per_asn: {packets: {rate: 1/s, burst: 1}}
rules:
  - name: big
    match: {prefixes: [192.0.2.0/24]}
    per_asn: {packets: 1000/s}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.GlobalReserve != 0 || p.Defaults.Reserve != 0 || p.Rules[0].Limits.Reserve != DefaultReserve {
		t.Errorf("implicit reserves: global %d, defaults %d, rule %d", p.GlobalReserve, p.Defaults.Reserve, p.Rules[0].Limits.Reserve)
	}
}

// TestStandingPersonalBurstSeconds: burst_seconds is 2 unless set, kept by
// personal_budget: off, and set alone or with the other fields.
func TestStandingPersonalBurstSeconds(t *testing.T) {
	for body, want := range map[string]uint32{
		"":                                 2,
		"standing: {personal_budget: off}": 2,
		"standing: {personal_budget: {burst_seconds: 1}}":                1,
		"standing: {personal_budget: {headroom: 3, burst_seconds: 60}}":  60,
		"standing: {personal_budget: {default: 5/s, burst_seconds: 10}}": 10,
	} {
		p, err := parseStanding(t, body, nil)
		if err != nil {
			t.Errorf("%q: %v", body, err)
			continue
		}
		if p.Standing.PersonalBurstSeconds != want {
			t.Errorf("%q: burst_seconds %d, want %d", body, p.Standing.PersonalBurstSeconds, want)
		}
	}
}
