package daemon

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// sampleBudget is how many drop samples per second the data plane sends to
// the daemon for top-talker reports.
func sampleBudget() maps.Rate { return maps.Rate{Count: 1000, Per: time.Second, Burst: 100} }

func bucket(b policy.Bucket) maps.Bucket {
	return maps.Bucket{
		Packets: maps.Rate{Count: b.Packets.Rate.Count, Per: b.Packets.Rate.Per, Burst: b.Packets.Burst},
		Bytes:   maps.Rate{Count: b.Bytes.Rate.Count, Per: b.Bytes.Rate.Per, Burst: b.Bytes.Burst},
	}
}

func ruleMode(m policy.RuleMode) maps.Mode {
	switch m {
	case policy.RuleModeEnforce:
		return maps.ModeEnforce
	case policy.RuleModeDryRun:
		return maps.ModeDryRun
	}
	return maps.ModeInherit
}

func ruleAction(a policy.Action) maps.RuleAction {
	switch a {
	case policy.ActionDrop:
		return maps.RuleDrop
	case policy.ActionPass:
		return maps.RulePass
	}
	return maps.RuleLimit
}

func aggMode(m policy.AggregateMode) maps.AggMode {
	switch m {
	case policy.AggregateWhole:
		return maps.AggWhole
	case policy.AggregateDerived:
		return maps.AggDerived
	}
	return maps.AggNone
}

// Generation converts a compiled policy into what the data plane holds.
func Generation(c *policy.Compiled) maps.Generation {
	g := maps.Generation{
		Settings: maps.Settings{
			Mode:          maps.ModeEnforce,
			Malformed:     maps.ActPass,
			Global:        bucket(c.Global),
			Samples:       sampleBudget(),
			GlobalReserve: c.GlobalReserve,
		},
		Standing: maps.StandingSettings{
			EstablishedAfter: c.Standing.EstablishedAfter,
			Penalty:          c.Standing.Penalty,
			KnownGood:        c.Standing.KnownGood,
		},
	}
	if c.Mode == policy.ModeDryRun {
		g.Settings.Mode = maps.ModeDryRun
	}
	if c.Malformed == policy.VerdictDrop {
		g.Settings.Malformed = maps.ActDrop
	}
	if c.Clock == policy.ClockCoarse {
		g.Settings.Clock = maps.ClockCoarse
	}
	for _, r := range c.Rules {
		g.Rules = append(g.Rules, maps.Rule{
			ID:      r.ID,
			Src:     bucket(r.PerSource),
			SrcLen4: r.SourceKey.V4, SrcLen6: r.SourceKey.V6,
			Agg:     bucket(r.PerPrefix),
			AggMode: aggMode(r.Aggregate), AggLen4: r.AggregateKey.V4, AggLen6: r.AggregateKey.V6,
			ASN:     bucket(r.PerASN),
			Mode:    ruleMode(r.Mode),
			Action:  ruleAction(r.Action),
			Reserve: r.Reserve,
		})
	}
	for _, p := range c.Prefixes {
		g.Prefixes = append(g.Prefixes, maps.PrefixFact{Prefix: p.Prefix, RuleID: p.RuleID, ASN: p.ASN, Country: p.Country})
	}
	for _, l := range c.L4 {
		dir := maps.L4Any
		switch l.Dir {
		case policy.PortSrc:
			dir = maps.L4Src
		case policy.PortDst:
			dir = maps.L4Dst
		}
		g.L4 = append(g.L4, maps.L4Match{Proto: l.Protocol, Dir: dir, Port: l.Port, RuleID: l.RuleID})
	}
	return g
}

// monoClock converts wall-clock expiry times into the CLOCK_MONOTONIC
// nanoseconds the data plane compares with bpf_ktime_get_ns.
type monoClock struct {
	wall time.Time
	mono uint64
}

func nowMono() (monoClock, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return monoClock{}, fmt.Errorf("read monotonic clock: %w", err)
	}
	return monoClock{wall: time.Now(), mono: uint64(ts.Nano())}, nil
}

func (c monoClock) until(l policy.Listing) uint64 {
	if !l.Listed {
		return 0
	}
	if l.Until.IsZero() {
		return maps.Forever
	}
	d := l.Until.Sub(c.wall)
	if d <= 0 {
		return 1 // already expired: listed, but never in force
	}
	return c.mono + uint64(d)
}

// ListEntries converts folded list records into lists-trie entries.
func ListEntries(recs []policy.ListRecord) ([]maps.ListEntry, error) {
	clock, err := nowMono()
	if err != nil {
		return nil, err
	}
	out := make([]maps.ListEntry, 0, len(recs))
	for _, r := range recs {
		out = append(out, maps.ListEntry{Prefix: r.Prefix, DenyUntil: clock.until(r.Deny), AllowUntil: clock.until(r.Allow)})
	}
	return out, nil
}
