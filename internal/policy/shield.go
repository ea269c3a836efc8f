package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// ShieldMode is the adaptive shield's mode (docs/shield.md).
type ShieldMode string

// Shield modes.
const (
	ShieldOff     ShieldMode = "off"
	ShieldMonitor ShieldMode = "monitor" // learn, decide and report; change nothing
	ShieldEnforce ShieldMode = "enforce"
)

// Shield is the shield: section. A policy without one runs the shield
// off; the built-in default policy has mode: monitor.
type Shield struct {
	Mode     ShieldMode
	Interval time.Duration

	// baseline:
	HalfLife      time.Duration
	Percentile    float64 // (0, 1)
	LearnFor      time.Duration
	Current       time.Duration
	MaxAggregates int

	// surge:
	Factor, EndFactor float64
	Sustain, Cooldown time.Duration
	MinRate           Rate // packets

	// actions:
	TTL            time.Duration
	MaxActive      int
	TightenTo      float64
	Fingerprints   bool
	FingerprintMin Rate
	MinCoverage    float64
	MaxCollateral  float64

	// Forbid are aggregates the shield never touches: source prefixes
	// and ASNs.
	Forbid []ShieldForbid
	Pos    Pos
}

// ShieldForbid is one shield.forbid entry: a prefix or an ASN.
type ShieldForbid struct {
	Prefix netip.Prefix
	ASN    uint32
	Pos    Pos
}

// DefaultShield is what each field of a shield: section defaults to.
func DefaultShield() Shield {
	return Shield{
		Mode: ShieldMonitor, Interval: time.Second,
		HalfLife: 6 * time.Hour, Percentile: 0.95, LearnFor: 10 * time.Minute, Current: 2 * time.Second,
		MaxAggregates: 4096,
		Factor:        3, EndFactor: 1.5, Sustain: 2 * time.Second, Cooldown: 30 * time.Second,
		MinRate: Rate{Count: 1000, Per: time.Second},
		TTL:     5 * time.Minute, MaxActive: 16, TightenTo: 1, Fingerprints: true,
		FingerprintMin: Rate{Count: 100, Per: time.Second}, MinCoverage: 0.8, MaxCollateral: 0.05,
	}
}

// PerSecond is the rate in events per second.
func (r Rate) PerSecond() float64 {
	if r.Per <= 0 {
		return 0
	}
	return float64(r.Count) / r.Per.Seconds()
}

// shieldTable is the shield: section, one row per knob.
var shieldTable = yamlcheck.NewTable("shield",
	yamlcheck.Val("mode", yamlcheck.Enum[ShieldMode]{Values: []ShieldMode{ShieldOff, ShieldMonitor, ShieldEnforce}},
		func(s *Shield) *ShieldMode { return &s.Mode }, "off, monitor (learn, decide and report; change nothing) or enforce"),
	yamlcheck.Val("interval", yamlcheck.Duration{Min: 100 * time.Millisecond, Max: time.Minute},
		func(s *Shield) *time.Duration { return &s.Interval }, "how often the shield measures and decides"),
	yamlcheck.Sub("baseline", "what the shield learns as normal",
		yamlcheck.Val("half_life", yamlcheck.Duration{Min: 10 * time.Second, Max: 30 * 24 * time.Hour},
			func(s *Shield) *time.Duration { return &s.HalfLife }, "half-life of the learned baseline"),
		yamlcheck.Val("percentile", yamlcheck.Percent{Min: 0.5, Max: 0.999},
			func(s *Shield) *float64 { return &s.Percentile }, "the percentile of an aggregate's rates that is its baseline"),
		yamlcheck.Val("learn_for", yamlcheck.Duration{Min: time.Second, Max: 30 * 24 * time.Hour},
			func(s *Shield) *time.Duration { return &s.LearnFor }, "how long an aggregate is learned before the shield acts on it"),
		yamlcheck.Val("current_window", yamlcheck.Duration{Min: 100 * time.Millisecond, Max: 10 * time.Minute},
			func(s *Shield) *time.Duration { return &s.Current }, "the window of the current rate compared with the baseline"),
		yamlcheck.Val("max_aggregates", yamlcheck.Uint[int]{Min: 16, Max: 1 << 20},
			func(s *Shield) *int { return &s.MaxAggregates }, "the most aggregates with a baseline"),
	),
	yamlcheck.Sub("surge", "when an aggregate surges",
		yamlcheck.Val("factor", yamlcheck.Factor{Min: 1.1, Max: 1000},
			func(s *Shield) *float64 { return &s.Factor }, "a surge starts above factor × baseline"),
		yamlcheck.Val("end_factor", yamlcheck.Factor{Min: 1, Max: 1000},
			func(s *Shield) *float64 { return &s.EndFactor }, "and ends under end_factor × baseline (below factor)"),
		yamlcheck.Val("sustain", yamlcheck.Duration{Min: 0, Max: time.Hour},
			func(s *Shield) *time.Duration { return &s.Sustain }, "how long the rate must stay above before it is a surge"),
		yamlcheck.Val("cooldown", yamlcheck.Duration{Min: 0, Max: 24 * time.Hour},
			func(s *Shield) *time.Duration { return &s.Cooldown }, "how long after a surge the shield waits before it relaxes"),
		yamlcheck.Val("min_rate", packetRate{}, func(s *Shield) *Rate { return &s.MinRate },
			"the least current rate that can be a surge"),
	),
	yamlcheck.Sub("actions", "what the shield does about a surge",
		yamlcheck.Val("ttl", yamlcheck.Duration{Min: 5 * time.Second, Max: 24 * time.Hour},
			func(s *Shield) *time.Duration { return &s.TTL }, "how long an action lasts unless renewed (more than twice interval)"),
		yamlcheck.Val("max_active", yamlcheck.Uint[int]{Min: 1, Max: 1024},
			func(s *Shield) *int { return &s.MaxActive }, "the most actions at once"),
		yamlcheck.Val("tighten_to", yamlcheck.Factor{Min: 1, Max: 100},
			func(s *Shield) *float64 { return &s.TightenTo }, "a surging aggregate is limited to tighten_to × its baseline"),
		yamlcheck.Val("fingerprints", yamlcheck.Bool{}, func(s *Shield) *bool { return &s.Fingerprints },
			"whether the shield drops a surge's packet fingerprints"),
		yamlcheck.Val("fingerprint_min", packetRate{}, func(s *Shield) *Rate { return &s.FingerprintMin },
			"the least rate of a fingerprint the shield acts on"),
		yamlcheck.Val("min_coverage", yamlcheck.Percent{Min: 0.5, Max: 1},
			func(s *Shield) *float64 { return &s.MinCoverage }, "the share of a surge fingerprints must cover"),
		yamlcheck.Val("max_collateral", yamlcheck.Percent{Min: 0, Max: 0.5},
			func(s *Shield) *float64 { return &s.MaxCollateral }, "the most of the baseline's traffic fingerprints may match"),
	),
	yamlcheck.Val[Shield, []ShieldForbid]("forbid", shieldForbidList{}, func(s *Shield) *[]ShieldForbid { return &s.Forbid },
		"aggregates the shield never touches: source prefixes and ASNs (AS64500)"),
)

func (ps *parser) shield(n *yaml.Node) *Shield {
	s := DefaultShield()
	f := shieldTable.Parse(&ps.Checker, n, &s)
	if f == nil {
		return nil
	}
	s.Pos = Pos{Line: n.Line, Column: n.Column}
	if v, ok := f["surge"]; ok && s.EndFactor >= s.Factor {
		ps.Errorf(v, "shield.surge: end_factor %g must be below factor %g (hysteresis: a surge starts above factor x baseline and ends under end_factor x baseline)", s.EndFactor, s.Factor)
	}
	if s.Current < s.Interval {
		ps.Errorf(n, "shield: baseline.current_window %s is shorter than interval %s", s.Current, s.Interval)
	}
	if s.TTL <= 2*s.Interval {
		ps.Errorf(n, "shield: actions.ttl %s must be more than twice interval %s (actions are renewed at half their TTL)", s.TTL, s.Interval)
	}
	return &s
}

// shieldForbidList is shield.forbid: source prefixes and ASNs.
type shieldForbidList struct{}

func (shieldForbidList) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]ShieldForbid, bool) {
	var out []ShieldForbid
	for _, item := range c.Seq(n, where) {
		str, ok := c.Scalar(item, where+" entry")
		if !ok {
			continue
		}
		e := ShieldForbid{Pos: Pos{Line: item.Line, Column: item.Column}}
		if strings.HasPrefix(strings.ToUpper(str), "AS") {
			a, err := ParseASN(str)
			if err != nil {
				c.Errorf(item, "%s: %v", where, err)
				continue
			}
			e.ASN = a
		} else {
			p, err := ParsePrefix(str)
			if err != nil {
				c.Errorf(item, "%s: %v (or write an ASN as AS64500)", where, err)
				continue
			}
			e.Prefix = p
		}
		out = append(out, e)
	}
	return out, true
}

func (k shieldForbidList) Format(v []ShieldForbid) string {
	return "[" + strings.Join(k.Items(v), ", ") + "]"
}

func (shieldForbidList) Items(v []ShieldForbid) []string {
	out := make([]string, len(v))
	for i, f := range v {
		if f.Prefix.IsValid() {
			out[i] = f.Prefix.String()
		} else {
			out[i] = fmt.Sprintf("AS%d", f.ASN)
		}
	}
	return out
}

func (shieldForbidList) Describe() string { return "list of CIDRs and ASNs" }

// String is the mode for messages.
func (m ShieldMode) String() string { return string(m) }

// shield reports a changed shield: section: its presence, and each knob
// that changed.
func (d *differ) shield(a, b *Shield) {
	switch {
	case a == nil && b == nil:
		return
	case a == nil:
		d.add('+', "shield section (mode %s)", b.Mode)
		return
	case b == nil:
		d.add('-', "shield section (the shield is off)")
		return
	}
	shieldTable.DiffWith("shield ", a, b, d.emit)
}
