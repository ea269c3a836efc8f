// Package maps gives typed Go views of every map of the XDP limiter. It is
// the only package that knows byte layouts: callers pass netip values and
// plain Go structs, per-CPU values come back summed.
package maps

import (
	"fmt"
	"slices"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// Action is a verdict of the data plane.
type Action = loader.LimiterEgAction

// Reason says why a packet got its verdict.
type Reason = loader.LimiterEgReason

// Verdict actions.
const (
	ActPass      = loader.LimiterEgActionEG_ACT_PASS
	ActDrop      = loader.LimiterEgActionEG_ACT_DROP
	ActWouldDrop = loader.LimiterEgActionEG_ACT_WOULD_DROP
	numActions   = int(loader.LimiterEgActionEG_ACT_MAX)
	numReasons   = int(loader.LimiterEgReasonEG_R_MAX)
)

// Reasons, as counted by the data plane.
const (
	ReasonOK          = loader.LimiterEgReasonEG_R_OK
	ReasonNonIP       = loader.LimiterEgReasonEG_R_NON_IP
	ReasonNoPolicy    = loader.LimiterEgReasonEG_R_NO_POLICY
	ReasonAllow       = loader.LimiterEgReasonEG_R_ALLOW_LIST
	ReasonDeny        = loader.LimiterEgReasonEG_R_DENY_LIST
	ReasonSrcLimit    = loader.LimiterEgReasonEG_R_SOURCE_LIMIT
	ReasonPrefixLimit = loader.LimiterEgReasonEG_R_PREFIX_LIMIT
	ReasonASNLimit    = loader.LimiterEgReasonEG_R_ASN_LIMIT
	ReasonGlobalLimit = loader.LimiterEgReasonEG_R_GLOBAL_LIMIT
	ReasonBadEth      = loader.LimiterEgReasonEG_R_BAD_ETHERNET
	ReasonBadVLAN     = loader.LimiterEgReasonEG_R_BAD_VLAN
	ReasonBadIPv4     = loader.LimiterEgReasonEG_R_BAD_IPV4
	ReasonBadIPv6     = loader.LimiterEgReasonEG_R_BAD_IPV6
	ReasonBadL4       = loader.LimiterEgReasonEG_R_BAD_L4
	ReasonRuleDrop    = loader.LimiterEgReasonEG_R_RULE_DROP
	ReasonRulePass    = loader.LimiterEgReasonEG_R_RULE_PASS
	ReasonBadIPLen    = loader.LimiterEgReasonEG_R_BAD_IP_LENGTH
	ReasonICMPFamily  = loader.LimiterEgReasonEG_R_ICMP_WRONG_FAMILY
	// Refusals by an override, named by its writer (docs/operations.md,
	// "Drop reasons").
	ReasonShieldTighten = loader.LimiterEgReasonEG_R_SHIELD_TIGHTEN
	ReasonFleetShare    = loader.LimiterEgReasonEG_R_FLEET_SHARE
	ReasonOverride      = loader.LimiterEgReasonEG_R_OVERRIDE
)

// ActionName is the metric label of an action: its C enumerator
// (enum eg_action) without EG_ACT_, lowercased (internal/loader/enumnames).
func ActionName(a Action) string {
	if int(a) < len(loader.LimiterEgActionNames) {
		return loader.LimiterEgActionNames[a]
	}
	return fmt.Sprintf("action_%d", a)
}

// ReasonName is the metric label of a reason: its C enumerator (enum
// eg_reason) without EG_R_, lowercased.
func ReasonName(r Reason) string {
	if int(r) < len(loader.LimiterEgReasonNames) {
		return loader.LimiterEgReasonNames[r]
	}
	return fmt.Sprintf("reason_%d", r)
}

// ReasonNames are the reasons' names (ReasonName), by value.
func ReasonNames() []string { return slices.Clone(loader.LimiterEgReasonNames[:]) }

// ReasonByName is the reason of a name ReasonName gives.
func ReasonByName(name string) (Reason, bool) {
	for i, n := range loader.LimiterEgReasonNames {
		if n == name {
			return Reason(i), true
		}
	}
	return 0, false
}

// Mode is enforce or dry-run (rules may also inherit the global mode).
type Mode = loader.LimiterEgMode

// Modes.
const (
	ModeInherit = loader.LimiterEgModeEG_MODE_INHERIT
	ModeEnforce = loader.LimiterEgModeEG_MODE_ENFORCE
	ModeDryRun  = loader.LimiterEgModeEG_MODE_DRY_RUN
)

// Clock is the kernel clock that drives a generation's buckets.
type Clock = loader.LimiterEgClock

// Clocks. The zero value is ClockPrecise, the policy file's default.
const (
	// ClockPrecise reads CLOCK_MONOTONIC from the clock source for every
	// packet.
	ClockPrecise = loader.LimiterEgClockEG_CLOCK_PRECISE
	// ClockCoarse is CLOCK_MONOTONIC as of the last tick: no clock source
	// read per packet. Rates hold exactly over time; within a tick the
	// clock stands still, so a bucket may admit up to rate x lag beyond
	// its burst in a short window (docs/operations.md, "Clock").
	ClockCoarse = loader.LimiterEgClockEG_CLOCK_COARSE
)

// RuleAction is what a rule does: limit, drop or pass.
type RuleAction = loader.LimiterEgRuleAction

// Rule actions.
const (
	RuleLimit = loader.LimiterEgRuleActionEG_RULE_LIMIT
	RuleDrop  = loader.LimiterEgRuleActionEG_RULE_DROP
	RulePass  = loader.LimiterEgRuleActionEG_RULE_PASS
)

// AggMode says how a rule's prefix aggregate is keyed.
type AggMode = loader.LimiterEgAggMode

// Aggregate modes.
const (
	AggNone    = loader.LimiterEgAggModeEG_AGG_NONE
	AggWhole   = loader.LimiterEgAggModeEG_AGG_WHOLE
	AggDerived = loader.LimiterEgAggModeEG_AGG_DERIVED
)

// L4Dir says which port an L4 match looks at.
type L4Dir = loader.LimiterEgL4Dir

// L4 match directions.
const (
	L4Any = loader.LimiterEgL4DirEG_L4ANY
	L4Src = loader.LimiterEgL4DirEG_L4SRC
	L4Dst = loader.LimiterEgL4DirEG_L4DST
)

// Rate is Count events per Per, with a burst of Burst events. A zero Count
// means no limit. The SYN path's settings (SynService) use it; the limiter's
// buckets come from policy.Bucket (see BucketConfig).
type Rate struct {
	Count uint64
	Per   time.Duration
	Burst uint64
}

// Limited reports whether the rate limits anything.
func (r Rate) Limited() bool { return r.Count != 0 }
