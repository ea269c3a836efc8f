package policy

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/examples"
)

func TestShieldSection(t *testing.T) {
	p, err := Parse("p.yaml", []byte(`apiVersion: edgeguard/v1
shield:
  mode: enforce
  interval: 500ms
  baseline: {half_life: 1h, percentile: 99%, learn_for: 30s, current_window: 3s, max_aggregates: 100}
  surge: {factor: 4x, end_factor: 2, sustain: 1s, cooldown: 10s, min_rate: 2k/s}
  actions: {ttl: 1m, max_active: 3, tighten_to: 1.5, fingerprints: false, fingerprint_min: 50/s, min_coverage: 90%, max_collateral: 1%}
  forbid: [198.18.0.0/24, AS64500, 2001:db8::/32]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Shield
	want := Shield{Mode: ShieldEnforce, Interval: 500 * time.Millisecond, HalfLife: time.Hour, Percentile: 0.99,
		LearnFor: 30 * time.Second, Current: 3 * time.Second, MaxAggregates: 100, Factor: 4, EndFactor: 2,
		Sustain: time.Second, Cooldown: 10 * time.Second, MinRate: Rate{Count: 2000, Per: time.Second},
		TTL: time.Minute, MaxActive: 3, TightenTo: 1.5, FingerprintMin: Rate{Count: 50, Per: time.Second},
		MinCoverage: 0.9, MaxCollateral: 0.01}
	got := *s
	got.Forbid, got.Pos = nil, Pos{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("shield\n got %+v\nwant %+v", got, want)
	}
	if len(s.Forbid) != 3 || s.Forbid[0].Prefix != netip.MustParsePrefix("198.18.0.0/24") || s.Forbid[1].ASN != 64500 || s.Forbid[1].Pos.Line != 8 {
		t.Fatalf("forbid %+v", s.Forbid)
	}
	if p, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\n"), nil); err != nil || p.Shield != nil {
		t.Fatalf("no shield section: %v %v", p.Shield, err)
	}
	if p, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\nshield: {}\n"), nil); err != nil || p.Shield.Mode != ShieldMonitor || p.Shield.Factor != 3 {
		t.Fatalf("empty shield section: %+v %v", p.Shield, err)
	}
}

// TestShieldDefaultPolicy: the built-in policy runs the shield in monitor.
func TestShieldDefaultPolicy(t *testing.T) {
	p, err := Parse(examples.DefaultPolicyName, examples.DefaultPolicy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Shield == nil || p.Shield.Mode != ShieldMonitor {
		t.Fatalf("built-in policy shield: %+v", p.Shield)
	}
}

// TestShieldProblems: hostile and mistaken sections are refused with the
// line and column of the value.
func TestShieldProblems(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"mode: on", `3:9: shield.mode "on" is not allowed`},
		{"surge: {factor: 1}", "3:19: shield.surge.factor 1: must be between 1.1 and 1000"},
		{"surge: {factor: 2, end_factor: 3}", "3:10: shield.surge: end_factor 3 must be below factor 2"},
		{"surge: {factor: NaN}", `3:19: shield.surge.factor "NaN"`},
		{"surge: {min_rate: 10Mbit/s}", `3:21: shield.surge.min_rate "10Mbit/s": want packets`},
		{"actions: {tighten_to: 0.5}", "3:25: shield.actions.tighten_to 0.5: must be between 1 and 100"},
		{"actions: {max_active: 0}", "3:25:"},
		{"actions: {max_collateral: 90%}", "3:29: shield.actions.max_collateral 90%: must be between 0% and 50%"},
		{"actions: {fingerprints: yes}", `3:27: shield.actions.fingerprints "yes"`},
		{"baseline: {percentile: 101%}", "3:26: shield.baseline.percentile 101%"},
		{"baseline: {current_window: 1s}\n  interval: 5s", "3:3: shield: baseline.current_window 1s is shorter than interval 5s"},
		{"actions: {ttl: 5s}\n  interval: 3s\n  baseline: {current_window: 3s}", "3:3: shield: actions.ttl 5s must be more than twice"},
		{"forbid: [AS0]", "3:12: shield.forbid:"},
		{"forbid: [198.18.0.1/24]", "3:12: shield.forbid: bad CIDR"},
		{"forbid: [{prefix: 1.2.3.0/24}]", "3:12:"},
		{"colour: blue", `3:3: unknown field "colour" in shield`},
	} {
		_, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\nshield:\n  "+c.body+"\n"), nil)
		var ve *ValidationError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}

func TestShieldDiff(t *testing.T) {
	parse := func(sec string) *Policy {
		p, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\n"+sec), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	none, mon := parse(""), parse("shield: {mode: monitor}\n")
	enf := parse("shield: {mode: enforce, surge: {factor: 4}, forbid: [AS64500]}\n")
	text := func(cs []Change) string {
		var out []string
		for _, c := range cs {
			out = append(out, string(c.Op)+" "+c.Text)
		}
		return strings.Join(out, "; ")
	}
	for _, c := range []struct {
		a, b *Policy
		want string
	}{
		{none, mon, "+ shield section (mode monitor)"},
		{mon, none, "- shield section (the shield is off)"},
		{mon, mon, ""},
		{mon, enf, "~ shield mode monitor -> enforce; ~ shield surge.factor 3 -> 4; + shield forbid AS64500"},
	} {
		if got := text(DiffSections(c.a, c.b, nil)); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}
