package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
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

func (ps *parser) shield(n *yaml.Node) *Shield {
	f := ps.Fields(n, "shield", "mode", "interval", "baseline", "surge", "actions", "forbid")
	if f == nil {
		return nil
	}
	s := DefaultShield()
	s.Pos = Pos{Line: n.Line, Column: n.Column}
	if v, ok := f["mode"]; ok {
		s.Mode = ShieldMode(ps.enum(v, "shield.mode", string(s.Mode), string(ShieldOff), string(ShieldMonitor), string(ShieldEnforce)))
	}
	if v, ok := f["interval"]; ok {
		s.Interval = ps.duration(v, "shield.interval", 100*time.Millisecond, time.Minute, s.Interval)
	}
	if v, ok := f["baseline"]; ok {
		bf := ps.Fields(v, "shield.baseline", "half_life", "percentile", "learn_for", "current_window", "max_aggregates")
		if x, ok := bf["half_life"]; ok {
			s.HalfLife = ps.duration(x, "shield.baseline.half_life", 10*time.Second, 30*24*time.Hour, s.HalfLife)
		}
		if x, ok := bf["percentile"]; ok {
			s.Percentile = ps.percent(x, "shield.baseline.percentile", 0.5, 0.999, s.Percentile)
		}
		if x, ok := bf["learn_for"]; ok {
			s.LearnFor = ps.duration(x, "shield.baseline.learn_for", time.Second, 30*24*time.Hour, s.LearnFor)
		}
		if x, ok := bf["current_window"]; ok {
			s.Current = ps.duration(x, "shield.baseline.current_window", 100*time.Millisecond, 10*time.Minute, s.Current)
		}
		if x, ok := bf["max_aggregates"]; ok {
			if m, ok := ps.UintIn(x, "shield.baseline.max_aggregates", 16, 1<<20); ok {
				s.MaxAggregates = int(m)
			}
		}
	}
	if v, ok := f["surge"]; ok {
		sf := ps.Fields(v, "shield.surge", "factor", "end_factor", "sustain", "cooldown", "min_rate")
		if x, ok := sf["factor"]; ok {
			s.Factor = ps.factor(x, "shield.surge.factor", 1.1, 1000, s.Factor)
		}
		if x, ok := sf["end_factor"]; ok {
			s.EndFactor = ps.factor(x, "shield.surge.end_factor", 1, 1000, s.EndFactor)
		}
		if s.EndFactor >= s.Factor {
			ps.Errorf(v, "shield.surge: end_factor %g must be below factor %g (hysteresis: a surge starts above factor x baseline and ends under end_factor x baseline)", s.EndFactor, s.Factor)
		}
		if x, ok := sf["sustain"]; ok {
			s.Sustain = ps.duration(x, "shield.surge.sustain", 0, time.Hour, s.Sustain)
		}
		if x, ok := sf["cooldown"]; ok {
			s.Cooldown = ps.duration(x, "shield.surge.cooldown", 0, 24*time.Hour, s.Cooldown)
		}
		if x, ok := sf["min_rate"]; ok {
			s.MinRate = ps.packetRate(x, "shield.surge.min_rate", s.MinRate)
		}
	}
	if v, ok := f["actions"]; ok {
		af := ps.Fields(v, "shield.actions", "ttl", "max_active", "tighten_to", "fingerprints", "fingerprint_min",
			"min_coverage", "max_collateral")
		if x, ok := af["ttl"]; ok {
			s.TTL = ps.duration(x, "shield.actions.ttl", 5*time.Second, 24*time.Hour, s.TTL)
		}
		if x, ok := af["max_active"]; ok {
			if m, ok := ps.UintIn(x, "shield.actions.max_active", 1, 1024); ok {
				s.MaxActive = int(m)
			}
		}
		if x, ok := af["tighten_to"]; ok {
			s.TightenTo = ps.factor(x, "shield.actions.tighten_to", 1, 100, s.TightenTo)
		}
		if x, ok := af["fingerprints"]; ok {
			switch b, _ := ps.Scalar(x, "shield.actions.fingerprints"); b {
			case "true":
				s.Fingerprints = true
			case "false":
				s.Fingerprints = false
			default:
				ps.Errorf(x, "shield.actions.fingerprints %q: want true or false", b)
			}
		}
		if x, ok := af["fingerprint_min"]; ok {
			s.FingerprintMin = ps.packetRate(x, "shield.actions.fingerprint_min", s.FingerprintMin)
		}
		if x, ok := af["min_coverage"]; ok {
			s.MinCoverage = ps.percent(x, "shield.actions.min_coverage", 0.5, 1, s.MinCoverage)
		}
		if x, ok := af["max_collateral"]; ok {
			s.MaxCollateral = ps.percent(x, "shield.actions.max_collateral", 0, 0.5, s.MaxCollateral)
		}
	}
	if s.Current < s.Interval {
		ps.Errorf(n, "shield: baseline.current_window %s is shorter than interval %s", s.Current, s.Interval)
	}
	if s.TTL <= 2*s.Interval {
		ps.Errorf(n, "shield: actions.ttl %s must be more than twice interval %s (actions are renewed at half their TTL)", s.TTL, s.Interval)
	}
	if v, ok := f["forbid"]; ok {
		for _, item := range ps.Seq(v, "shield.forbid") {
			str, ok := ps.Scalar(item, "shield.forbid entry")
			if !ok {
				continue
			}
			e := ShieldForbid{Pos: Pos{Line: item.Line, Column: item.Column}}
			if strings.HasPrefix(strings.ToUpper(str), "AS") {
				a, err := ParseASN(str)
				if err != nil {
					ps.Errorf(item, "shield.forbid: %v", err)
					continue
				}
				e.ASN = a
			} else {
				p, err := ParsePrefix(str)
				if err != nil {
					ps.Errorf(item, "shield.forbid: %v (or write an ASN as AS64500)", err)
					continue
				}
				e.Prefix = p
			}
			s.Forbid = append(s.Forbid, e)
		}
	}
	return &s
}

// percent parses "95%" (or a fraction like 0.95) into [lo, hi].
func (ps *parser) percent(n *yaml.Node, where string, lo, hi, def float64) float64 {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return def
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
	if err == nil && strings.HasSuffix(s, "%") {
		v /= 100
	}
	if err != nil || v != v {
		ps.Errorf(n, "%s %q: want a percentage like 95%%", where, s)
		return def
	}
	if v < lo || v > hi {
		ps.Errorf(n, "%s %s: must be between %g%% and %g%%", where, s, lo*100, hi*100)
		return def
	}
	return v
}

// factor parses a multiplier: 3, 1.5 or 3x.
func (ps *parser) factor(n *yaml.Node, where string, lo, hi, def float64) float64 {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return def
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "x"), 64)
	if err != nil || v != v {
		ps.Errorf(n, "%s %q: want a number like 3 or 1.5", where, s)
		return def
	}
	if v < lo || v > hi {
		ps.Errorf(n, "%s %s: must be between %g and %g", where, s, lo, hi)
		return def
	}
	return v
}

func (ps *parser) packetRate(n *yaml.Node, where string, def Rate) Rate {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return def
	}
	r, u, err := ParseRate(s)
	switch {
	case err != nil:
		ps.Errorf(n, "%s: %v", where, err)
	case u != Packets:
		ps.Errorf(n, "%s %q: want packets per time, like 1k/s", where, s)
	default:
		return r
	}
	return def
}

// String is the mode for messages.
func (m ShieldMode) String() string { return string(m) }

// shield reports a changed shield: section: its presence, its mode, and
// each other knob that changed.
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
	d.field("shield mode", string(a.Mode), string(b.Mode))
	fa, fb := shieldFields(a), shieldFields(b)
	for i := range fa {
		d.field("shield "+fa[i][0], fa[i][1], fb[i][1])
	}
}

func shieldFields(s *Shield) [][2]string {
	var forbid []string
	for _, f := range s.Forbid {
		if f.Prefix.IsValid() {
			forbid = append(forbid, f.Prefix.String())
		} else {
			forbid = append(forbid, fmt.Sprintf("AS%d", f.ASN))
		}
	}
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return [][2]string{
		{"interval", s.Interval.String()}, {"baseline.half_life", s.HalfLife.String()}, {"baseline.percentile", g(s.Percentile)},
		{"baseline.learn_for", s.LearnFor.String()}, {"baseline.current_window", s.Current.String()},
		{"baseline.max_aggregates", strconv.Itoa(s.MaxAggregates)}, {"surge.factor", g(s.Factor)},
		{"surge.end_factor", g(s.EndFactor)}, {"surge.sustain", s.Sustain.String()}, {"surge.cooldown", s.Cooldown.String()},
		{"surge.min_rate", g(s.MinRate.PerSecond()) + "/s"}, {"actions.ttl", s.TTL.String()},
		{"actions.max_active", strconv.Itoa(s.MaxActive)}, {"actions.tighten_to", g(s.TightenTo)},
		{"actions.fingerprints", strconv.FormatBool(s.Fingerprints)}, {"actions.fingerprint_min", g(s.FingerprintMin.PerSecond()) + "/s"},
		{"actions.min_coverage", g(s.MinCoverage)}, {"actions.max_collateral", g(s.MaxCollateral)},
		{"forbid", "[" + strings.Join(forbid, ", ") + "]"},
	}
}
