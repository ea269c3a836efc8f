package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/bpfsizes"
)

// Bounds of the standing: durations.
const (
	minEstablishedAfter = time.Second
	// A source's usual rate: the half-life's bounds (the data plane
	// computes in milliseconds; a day keeps its products in 64 bits), the
	// jump factor's, and the highest jump minimum (rates are kept in 32
	// bits at 1/16 packet per second).
	minRateHistory = 10 * time.Second
	maxRateHistory = 24 * time.Hour
	minJumpFactor  = 1.5
	maxJumpFactor  = 1000
	maxJumpMin     = 1_000_000
	// Bounds of standing.personal_budget: its headroom, and its default
	// (packets/s; at least 1/s so that no privileged source's budget is 0).
	minPersonalHeadroom = 1
	maxPersonalHeadroom = 100
	maxPersonalDefault  = 1_000_000
	maxStandingDuration = 7 * 24 * time.Hour
	// maxKnownGood is the known_good table's capacity in the data plane
	// (EG_DEFAULT_KNOWN_GOOD_ENTRIES, through bpfsizes).
	maxKnownGood = bpfsizes.KnownGoodEntries
)

// ParseReserve parses a reserve: "50%", "12.5%" or 0, to parts per million.
// It must be below 100%.
func ParseReserve(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	num, ok := strings.CutSuffix(s, "%")
	if !ok {
		return 0, fmt.Errorf("reserve %q: want a percentage of the burst like 50%% (or 0 to turn it off)", s)
	}
	whole, frac, _ := strings.Cut(num, ".")
	if whole == "" || len(frac) > 4 || strings.ContainsAny(whole+frac, "+-") {
		return 0, fmt.Errorf("reserve %q: want a percentage with at most 4 decimals, like 50%% or 12.5%%", s)
	}
	w, err := strconv.ParseUint(whole, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("reserve %q: want a percentage like 50%%", s)
	}
	var f uint64
	if frac != "" {
		if f, err = strconv.ParseUint(frac+strings.Repeat("0", 4-len(frac)), 10, 32); err != nil {
			return 0, fmt.Errorf("reserve %q: want a percentage like 50%%", s)
		}
	}
	if w >= 100 {
		return 0, fmt.Errorf("reserve %q must be below 100%%: new sources need some of the burst", s)
	}
	return uint32(w*10_000 + f), nil
}

// FormatReserve is ParseReserve's inverse.
func FormatReserve(ppm uint32) string {
	if ppm == 0 {
		return "0"
	}
	s := strconv.FormatFloat(float64(ppm)/10_000, 'f', -1, 64)
	return s + "%"
}

func (ps *parser) reserve(n *yaml.Node, where string) uint32 {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return DefaultReserve
	}
	r, err := ParseReserve(s)
	if err != nil {
		ps.Errorf(n, "%s: %v", where, err)
		return DefaultReserve
	}
	return r
}

// reserveFits reports whether a reserve leaves new sources at least one
// packet of a bucket's packet burst and one 1,500-byte packet of its byte
// burst.
func reserveFits(b Bucket, ppm uint32) bool {
	left := func(burst uint64) uint64 { return burst - (burst*uint64(ppm)+999_999)/1_000_000 }
	return (!b.Packets.IsSet() || left(b.Packets.Burst) >= 1) && (!b.Bytes.IsSet() || left(b.Bytes.Burst) >= 1500)
}

// implicitReserve is the reserve a bucket gets from the default when the
// file writes none: DefaultReserve where it fits, else 0, so that a policy
// with small bursts keeps admitting new sources.
func implicitReserve(ppm uint32, bs ...Bucket) uint32 {
	for _, b := range bs {
		if !reserveFits(b, ppm) {
			return 0
		}
	}
	return ppm
}

// checkReserve reports a reserve that leaves new sources less than one
// packet (or one 1,500-byte packet's bytes) of a bucket's burst: they could
// never be admitted. A reserve is a depth of the burst tolerance, so it must
// be smaller than the burst.
func (ps *parser) checkReserve(n *yaml.Node, where string, b Bucket, ppm uint32) {
	if ppm == 0 {
		return
	}
	left := func(burst uint64) uint64 { return burst - (burst*uint64(ppm)+999_999)/1_000_000 }
	if b.Packets.IsSet() && left(b.Packets.Burst) < 1 {
		ps.Errorf(n, "%s: reserve %s of a burst of %d packets leaves new sources no packet; lower the reserve or raise the burst",
			where, FormatReserve(ppm), b.Packets.Burst)
	}
	if b.Bytes.IsSet() && left(b.Bytes.Burst) < 1500 {
		ps.Errorf(n, "%s: reserve %s of a burst of %d bytes leaves new sources less than one 1,500-byte packet; lower the reserve or raise the burst",
			where, FormatReserve(ppm), b.Bytes.Burst)
	}
}

func (ps *parser) duration(n *yaml.Node, where string, lo, hi, def time.Duration) time.Duration {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		ps.Errorf(n, "%s %q: want a duration like 30s or 5m", where, s)
		return def
	}
	if d < lo || d > hi {
		ps.Errorf(n, "%s %s: must be between %s and %s", where, s, lo, hi)
		return def
	}
	return d
}

func (ps *parser) standing(n *yaml.Node, base Standing) Standing {
	out := base
	f := ps.Fields(n, "standing", "established_after", "penalty", "known_good", "l7_promotion", "rate_history", "jump_factor",
		"jump_min", "personal_budget")
	if v, ok := f["personal_budget"]; ok {
		out.PersonalHeadroom, out.PersonalDefault = ps.personalBudget(v, base)
	}
	if v, ok := f["established_after"]; ok {
		out.EstablishedAfter = ps.duration(v, "standing.established_after", minEstablishedAfter, maxStandingDuration, base.EstablishedAfter)
	}
	if v, ok := f["penalty"]; ok {
		out.Penalty = ps.duration(v, "standing.penalty", time.Second, maxStandingDuration, base.Penalty)
	}
	if v, ok := f["known_good"]; ok {
		out.KnownGood = ps.knownGood(v)
	}
	if v, ok := f["rate_history"]; ok {
		if s, _ := ps.Scalar(v, "standing.rate_history"); s == "0" || s == "off" {
			out.RateHistory = 0
		} else {
			out.RateHistory = ps.duration(v, "standing.rate_history", minRateHistory, maxRateHistory, base.RateHistory)
		}
	}
	if v, ok := f["jump_factor"]; ok {
		if s, _ := ps.Scalar(v, "standing.jump_factor"); s == "0" || s == "off" {
			out.JumpFactor = 0
		} else {
			out.JumpFactor = ps.factor(v, "standing.jump_factor", minJumpFactor, maxJumpFactor, base.JumpFactor)
		}
	}
	if v, ok := f["jump_min"]; ok {
		r := base.JumpMin
		if s, _ := ps.Scalar(v, "standing.jump_min"); s == "0" {
			r = Rate{} // no minimum
		} else {
			r = ps.packetRate(v, "standing.jump_min", base.JumpMin)
		}
		if r.PerSecond() > maxJumpMin {
			ps.Errorf(v, "standing.jump_min %v/s: must be at most %d/s", r.PerSecond(), maxJumpMin)
		} else {
			out.JumpMin = r
		}
	}
	if v, ok := f["l7_promotion"]; ok {
		pf := ps.Fields(v, "standing.l7_promotion", "enabled", "rate", "when")
		if w, ok := pf["when"]; ok {
			switch s, _ := ps.Scalar(w, "standing.l7_promotion.when"); PromotionWhen(s) {
			case PromoteAuthenticated:
				out.L7Promotion.When = PromotionWhen(s)
			case "route_passed":
				ps.Errorf(w, "standing.l7_promotion.when route_passed was removed: a bot's request passes a route's "+
					"limits as easily as a user's; use authenticated (docs/operations.md, \"L7 promotion\")")
			default:
				ps.Errorf(w, "standing.l7_promotion.when %q: want authenticated", s)
			}
		}
		if e, ok := pf["enabled"]; ok {
			switch s, _ := ps.Scalar(e, "standing.l7_promotion.enabled"); s {
			case "true":
				out.L7Promotion.Enabled = true
			case "false":
				out.L7Promotion.Enabled = false
			default:
				ps.Errorf(e, "standing.l7_promotion.enabled %q: want true or false", s)
			}
		}
		if r, ok := pf["rate"]; ok {
			if s, ok := ps.Scalar(r, "standing.l7_promotion.rate"); ok {
				rate, unit, err := ParseRate(s)
				switch {
				case err != nil:
					ps.Errorf(r, "standing.l7_promotion.rate: %v", err)
				case unit != Packets:
					ps.Errorf(r, "standing.l7_promotion.rate %q: want promotions per time, like 100/s", s)
				case rate.Count == 0:
					ps.Errorf(r, "standing.l7_promotion.rate must be above 0 (enabled: false turns promotion off)")
				default:
					out.L7Promotion.Rate = rate
				}
			}
		}
	}
	return out
}

// personalBudget parses standing.personal_budget: off, or {headroom: X,
// default: N/s}.
func (ps *parser) personalBudget(v *yaml.Node, base Standing) (float64, Rate) {
	if v.Kind == yaml.ScalarNode {
		if s, _ := ps.Scalar(v, "standing.personal_budget"); s != "off" {
			ps.Errorf(v, "standing.personal_budget %q: want off or {headroom: X, default: N/s}", s)
		}
		return 0, base.PersonalDefault
	}
	h, d := base.PersonalHeadroom, base.PersonalDefault
	if h == 0 {
		h = DefaultStanding().PersonalHeadroom
	}
	f := ps.Fields(v, "standing.personal_budget", "headroom", "default")
	if n, ok := f["headroom"]; ok {
		h = ps.factor(n, "standing.personal_budget.headroom", minPersonalHeadroom, maxPersonalHeadroom, h)
	}
	if n, ok := f["default"]; ok {
		r := ps.packetRate(n, "standing.personal_budget.default", d)
		if r.PerSecond() < 1 || r.PerSecond() > maxPersonalDefault {
			ps.Errorf(n, "standing.personal_budget.default %v/s: want 1/s to %d/s", r.PerSecond(), maxPersonalDefault)
		} else {
			d = r
		}
	}
	return h, d
}

// knownGood parses standing.known_good: CIDRs, and {file: PATH} entries
// naming files of one CIDR per line (# comments).
func (ps *parser) knownGood(n *yaml.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, item := range ps.Seq(n, "standing.known_good") {
		if item.Kind == yaml.MappingNode {
			f := ps.Fields(item, "standing.known_good entry", "file")
			file, ok := f["file"]
			if !ok {
				if f != nil {
					ps.Errorf(item, "standing.known_good entry needs file: PATH (or write a CIDR)")
				}
				continue
			}
			for _, e := range ps.listFile(file, "standing.known_good") {
				out = append(out, e.Prefix)
			}
			continue
		}
		s, ok := ps.Scalar(item, "standing.known_good entry")
		if !ok {
			continue
		}
		p, err := ParsePrefix(s)
		if err != nil {
			ps.Errorf(item, "standing.known_good: %v", err)
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, compareOutput)
	out = slices.Compact(out)
	if len(out) > maxKnownGood {
		ps.Errorf(n, "standing.known_good has %d prefixes; the data plane holds at most %d (aggregate them into shorter prefixes)", len(out), maxKnownGood)
	}
	return out
}

// standing lists what changed in the standing: section, field by field;
// known_good prefixes one by one.
func (d *differ) standing(a, b Standing) {
	d.field("setting standing.established_after", a.EstablishedAfter.String(), b.EstablishedAfter.String())
	d.field("setting standing.penalty", a.Penalty.String(), b.Penalty.String())
	d.field("setting standing.l7_promotion", formatPromotion(a.L7Promotion), formatPromotion(b.L7Promotion))
	d.field("setting standing.rate_history", a.RateHistory.String(), b.RateHistory.String())
	d.field("setting standing.jump_factor", strconv.FormatFloat(a.JumpFactor, 'g', -1, 64), strconv.FormatFloat(b.JumpFactor, 'g', -1, 64))
	if !a.JumpMin.Equal(b.JumpMin) {
		d.add('~', "setting standing.jump_min %s -> %s", FormatRate(a.JumpMin, Packets), FormatRate(b.JumpMin, Packets))
	}
	d.field("setting standing.personal_budget", formatPersonal(a), formatPersonal(b))
	had := make(map[netip.Prefix]bool, len(a.KnownGood))
	for _, p := range a.KnownGood {
		had[p] = true
	}
	has := make(map[netip.Prefix]bool, len(b.KnownGood))
	for _, p := range b.KnownGood {
		has[p] = true
		if !had[p] {
			d.add('+', "standing known_good %s", p)
		}
	}
	for _, p := range a.KnownGood {
		if !has[p] {
			d.add('-', "standing known_good %s", p)
		}
	}
}

func formatPersonal(s Standing) string {
	if s.PersonalHeadroom == 0 {
		return "off"
	}
	return fmt.Sprintf("{headroom: %s, default: %s}", strconv.FormatFloat(s.PersonalHeadroom, 'g', -1, 64),
		FormatRate(s.PersonalDefault, Packets))
}

func formatPromotion(p L7Promotion) string {
	if !p.Enabled {
		return "off"
	}
	return "rate " + FormatRate(p.Rate, Packets) + " when " + string(cmp.Or(p.When, PromoteAuthenticated))
}
