package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/bpfsizes"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
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
	// A personal budget's burst covers 1 to 60 of the source's busiest
	// seconds: below one it would refuse a source's own usual second;
	// above a minute it is no longer a clump's allowance but a sustained
	// overrun the budget exists to meter.
	maxPersonalBurstSeconds = 60
	maxStandingDuration     = 7 * 24 * time.Hour
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

// standingTable is the standing: section, one row per knob.
var standingTable = yamlcheck.NewTable("standing",
	yamlcheck.Val("established_after", yamlcheck.Duration{Min: minEstablishedAfter, Max: maxStandingDuration},
		func(s *Standing) *time.Duration { return &s.EstablishedAfter },
		"a new source that is seen (at or under its own limit, its aggregates not congested, no gap longer than this) "+
			"for this long becomes established; at L7 also the history (requests, none refused, no longer gap) that ranks a "+
			"client established (docs/operations.md, \"Class ranking at L7\")"),
	yamlcheck.Val("penalty", yamlcheck.Duration{Min: time.Second, Max: maxStandingDuration},
		func(s *Standing) *time.Duration { return &s.Penalty },
		"a source that exceeded its own limit, was escalated or deny-listed stays penalised this long after its last "+
			"offence, then is new again"),
	yamlcheck.Sub("l7_promotion", "lets the L7 stage mark sources validated (ranked `authenticated` at L7), at most `rate` "+
		"per second: a request that passed its route's limits, carried a credential its route's limits key on (a "+
		"`header:NAME` part, `user`, `tenant`) exactly once, non-empty and at most 1,024 bytes, and that the upstream "+
		"answered with a status from 200 to 399 (docs/operations.md, \"L7 promotion\")",
		yamlcheck.Val("enabled", yamlcheck.Bool{}, func(s *Standing) *bool { return &s.L7Promotion.Enabled },
			"whether the L7 stage promotes sources"),
		yamlcheck.Val("rate", packetRate{What: "promotions", NonZero: true}, func(s *Standing) *Rate { return &s.L7Promotion.Rate },
			"the most promotions per time (enabled: false turns promotion off)"),
		yamlcheck.Val("when", yamlcheck.Enum[PromotionWhen]{Values: []PromotionWhen{PromoteAuthenticated},
			Removed: map[PromotionWhen]string{"route_passed": "a bot's request passes a route's limits as easily as a user's; " +
				"use authenticated (docs/operations.md, \"L7 promotion\")"}},
			func(s *Standing) *PromotionWhen { return &s.L7Promotion.When },
			"what a request must do to promote its source; `route_passed` was removed (a bot's request passes a route's "+
				"limits as easily as a user's): a policy naming it is refused"),
	).Formatted(func(s *Standing) string { return formatPromotion(s.L7Promotion) }),
	yamlcheck.Val("rate_history", yamlcheck.Off[time.Duration]{Kind: yamlcheck.Duration{Min: minRateHistory, Max: maxRateHistory}},
		func(s *Standing) *time.Duration { return &s.RateHistory },
		"half-life of each source's usual rate, a decayed peak of its measured rates, and the window of its mean "+
			"rate (the personal budget's base) (docs/operations.md, \"Usual rate\", \"Personal budget\"). Only for rules "+
			"whose `per_source.key` is /32 and /64; off: no rates, no jumps, and every privileged source gets "+
			"`personal_budget.default`"),
	yamlcheck.Val("jump_factor", yamlcheck.Off[float64]{Kind: yamlcheck.Factor{Min: minJumpFactor, Max: maxJumpFactor}},
		func(s *Standing) *float64 { return &s.JumpFactor },
		"an established source whose current rate exceeds this × its usual rate (and `jump_min`) has jumped: inside "+
			"an aggregate the shield tightened all its traffic is charged as new (the personal budget moves only the excess, "+
			"everywhere). Validated sources keep their standing. Stored in 1/16; off: no jumps"),
	yamlcheck.Val("jump_min", yamlcheck.Off[Rate]{Kind: packetRate{Max: maxJumpMin}},
		func(s *Standing) *Rate { return &s.JumpMin },
		"the least current rate that counts as a jump (a source at 1/s going to 5/s is not a flood). Stored in 1/16 "+
			"packet/s; off: no minimum"),
	yamlcheck.Sub("personal_budget", "an established or validated source (or `known_good`) has priority at a congested "+
		"aggregate only up to its **personal budget**; what it sends above is charged as new (class `over_budget`). "+
		"off: no limit (standing is a flag, as before issue 23). docs/operations.md, \"Personal budget\" and \"Class ranking\"",
		yamlcheck.Val("headroom", yamlcheck.Factor{Min: minPersonalHeadroom, Max: maxPersonalHeadroom},
			func(s *Standing) *float64 { return &s.PersonalHeadroom },
			"the budget's rate: this × the source's mean rate over `rate_history` (uncongested measurements only). "+
				"Stored in 1/16"),
		yamlcheck.Val("default", packetRate{Min: 1, Max: maxPersonalDefault},
			func(s *Standing) *Rate { return &s.PersonalDefault },
			"the budget of a privileged source whose rate was never measured, and the least budget of a `known_good` or "+
				"validated one. Stored in 1/16 packet/s"),
		yamlcheck.Val("burst_seconds", yamlcheck.Uint[uint32]{Min: 1, Max: maxPersonalBurstSeconds},
			func(s *Standing) *uint32 { return &s.PersonalBurstSeconds },
			"the budget's burst: this many of the source's busiest seconds (its usual rate × `burst_seconds`), at least "+
				"one second of the budget and one packet"),
	).Switch(func(s *Standing) { s.PersonalHeadroom = 0 }, func(s *Standing) bool { return s.PersonalHeadroom == 0 }),
	yamlcheck.Val("known_good", prefixList{Max: maxKnownGood, TooMany: "the data plane holds at most %d (aggregate them into shorter prefixes)"},
		func(s *Standing) *[]netip.Prefix { return &s.KnownGood },
		"sources in these prefixes count as established while they have no standing of their own (cold start), "+
			"with a personal budget of at least `personal_budget.default`. List files: one CIDR per line, `#` comments, "+
			"relative to the policy file").Label("standing known_good"),
)

// standing lists what changed in the standing: section, field by field;
// known_good prefixes one by one.
func (d *differ) standing(a, b Standing) {
	standingTable.Diff(&a, &b, d.emit)
}

func formatPromotion(p L7Promotion) string {
	if !p.Enabled {
		return "off"
	}
	return "rate " + FormatRate(p.Rate, Packets) + " when " + string(cmp.Or(p.When, PromoteAuthenticated))
}
