// Package policy is Edgeguard's policy file: the model, the YAML parser with
// positioned validation, the compiler that turns a policy into the entries
// the data plane's maps hold, and a human-readable diff between two compiled
// policies. Everything here is pure: no kernel, no network, no clock.
package policy

import (
	"net/netip"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// APIVersion is the only policy file version this package reads.
const APIVersion = "edgeguard/v1"

// DefaultRuleName is the name of the rule that applies to traffic no other
// rule matches. Its id is always 0.
const DefaultRuleName = "default"

// DefaultMetricsListen is where metrics are served unless the file says otherwise.
const DefaultMetricsListen = "127.0.0.1:9469"

// Pos is a position in the policy file (1-based).
type Pos = yamlcheck.Pos

// Policy is a parsed, validated policy file. A *Policy returned by Load or
// Parse is valid: every field has been checked.
type Policy struct {
	File       string
	APIVersion string
	Interfaces []Interface
	Mode       Mode
	Malformed  Verdict
	Clock      Clock
	// Defaults are the limits of the default rule, and what a rule inherits
	// for each section it leaves out.
	Defaults Limits
	Global   Bucket
	// GlobalReserve is global.reserve, in parts per million of the global
	// bucket's burst tolerance (see Limits.Reserve).
	GlobalReserve uint32
	// Standing is the standing: section (docs/policy.md).
	Standing Standing
	Deny     []ListEntry
	Allow    []ListEntry
	// Protected (lists.protected) are prefixes run-time deny entries may
	// not cover or fall inside: 'edgectl deny add' refuses them without
	// --force, and L7 escalation never denies them.
	Protected []ListEntry
	Rules     []Rule
	Tables    Tables
	Metrics   Metrics
	ASNData   ASNData
	// L7 is the raw l7: section, kept with its position for the L7 stage to
	// decode and validate. Nil when the file has no l7: section.
	L7 *yaml.Node
	// SYN is the syn: section (SYN cookies in the data plane, syn.go);
	// nil without one.
	SYN *SYN
	// Shield is the shield: section (the adaptive shield, shield.go);
	// nil without one: the shield is off.
	Shield *Shield
	// Sampling is the sampling: section (sampling.go).
	Sampling Sampling
	// Fleet is the fleet: section (fleet.go); nil without one.
	Fleet *Fleet
	// BGP is the bgp: section (bgp.go, docs/bgp.md); nil without one.
	BGP *BGP
}

// Interface is one network interface the XDP program attaches to.
type Interface struct {
	Name    string
	XDPMode XDPMode
	Pos     Pos
}

// XDPMode is how the XDP program is attached.
type XDPMode string

// XDP attach modes.
const (
	XDPNative  XDPMode = "native"
	XDPGeneric XDPMode = "generic"
	XDPAuto    XDPMode = "auto"
)

// Mode is the global verdict mode.
type Mode string

// Global modes.
const (
	ModeEnforce Mode = "enforce"
	ModeDryRun  Mode = "dry-run"
)

// RuleMode is a rule's verdict mode: enforce, dry-run, or the global mode.
type RuleMode string

// Rule modes.
const (
	RuleModeInherit RuleMode = "inherit"
	RuleModeEnforce RuleMode = "enforce"
	RuleModeDryRun  RuleMode = "dry-run"
)

// Verdict is what happens to a malformed packet.
type Verdict string

// Malformed-packet verdicts.
const (
	VerdictPass Verdict = "pass"
	VerdictDrop Verdict = "drop"
)

// Clock is the kernel clock the XDP stage's buckets run on.
type Clock string

// Clocks (docs/operations.md, "Clock").
const (
	// ClockPrecise, the default: the clock source, read for every packet.
	ClockPrecise Clock = "precise"
	// ClockCoarse: the time of the last kernel tick (1/HZ).
	ClockCoarse Clock = "coarse"
)

// Action is what a rule does with the packets it matches.
type Action string

// Rule actions.
const (
	// ActionLimit applies the rule's token buckets.
	ActionLimit Action = "limit"
	// ActionDrop drops every matching packet.
	ActionDrop Action = "drop"
	// ActionPass passes every matching packet without limits.
	ActionPass Action = "pass"
)

// Bucket is one token bucket's two dimensions. Either may be unset.
type Bucket struct {
	Packets Limit
	Bytes   Limit
}

// IsSet reports whether either dimension is limited.
func (b Bucket) IsSet() bool { return b.Packets.IsSet() || b.Bytes.IsSet() }

// KeyBits are prefix lengths applied to a source address, per family.
type KeyBits struct {
	V4, V6 uint8
}

// PerSource limits each source address, masked to Key.
type PerSource struct {
	Bucket
	Key KeyBits
}

// PerPrefix limits the rule's sources together: all in one bucket (Whole),
// or one bucket per source masked to Derive (like hashlimit's srcmask).
type PerPrefix struct {
	Bucket
	Whole  bool
	Derive KeyBits
}

// Limits are the buckets a rule applies.
type Limits struct {
	PerSource PerSource
	PerPrefix PerPrefix
	PerASN    Bucket
	// Reserve is the share of the per_prefix and per_asn buckets' burst
	// tolerance that only established and validated sources may use, in
	// parts per million (DefaultReserve unless set; 0 turns it off; always
	// below 100%).
	Reserve uint32
}

// Rule is one prefix, ASN, country or L4 rule.
type Rule struct {
	Name   string
	Pos    Pos
	Action Action
	Mode   RuleMode
	Match  Match
	// Limits are complete: sections the file leaves out are copied from
	// the policy's defaults.
	Limits Limits
	// Scope is ScopeFleet when the fleet shares the rule's aggregate
	// budgets (fleet.go); ScopeHost otherwise.
	Scope Scope
}

// MatchKind says which of its match forms a rule uses (exactly one).
type MatchKind uint8

// Match kinds.
const (
	MatchPrefix MatchKind = iota + 1
	MatchASN
	MatchCountry
	MatchL4
)

func (k MatchKind) String() string {
	switch k {
	case MatchPrefix:
		return "prefixes"
	case MatchASN:
		return "asns"
	case MatchCountry:
		return "countries"
	case MatchL4:
		return "protocol"
	}
	return "none"
}

// Country is an ISO 3166-1 alpha-2 code in upper case, as asn.Entry holds it.
type Country [2]byte

func (c Country) String() string { return string(c[:]) }

// Match is what a rule matches. Exactly one of Prefixes, ASNs, Countries or
// Protocol is set.
type Match struct {
	Kind      MatchKind
	Prefixes  []netip.Prefix
	ASNs      []uint32
	Countries []Country
	// Protocol is an IP protocol number: TCP, UDP, ICMP or ICMPv6, the
	// ones the data plane parses. SrcPorts and DstPorts apply to TCP and
	// UDP, ICMPTypes to ICMP and ICMPv6 (the data plane reads the type where
	// a destination port would be). None of them means the protocol alone.
	Protocol  uint8
	SrcPorts  []uint16
	DstPorts  []uint16
	ICMPTypes []uint8
}

// ListEntry is one deny or allow list entry.
type ListEntry struct {
	Prefix netip.Prefix
	// Expires is when the entry stops applying; zero means never.
	Expires time.Time
	// Source says where the entry was written: "file:line:col".
	Source string
}

// Tables are the capacities of the data plane's maps, in entries, and the
// IPv4 direct table's budget, in chunks.
type Tables struct {
	PerSourceEntries uint32
	AggregateEntries uint32
	PrefixEntries    uint32
	ListEntries      uint32
	MaxRules         uint32
	// IPv4DirectChunks is the IPv4 direct table's budget of 16-entry
	// chunks per policy generation (the data plane's Sizes.V4Chunks): a
	// policy whose IPv4 prefix facts need more uses the prefix trie for
	// IPv4 sources, with the same answers but slower per packet.
	IPv4DirectChunks uint32
	// StandingEntries is the capacity of the standing table (one entry
	// per source address).
	StandingEntries uint32
}

// DefaultTables returns the capacities used for fields the file leaves out:
// the one default of each size. The loader sizes the maps from Tables
// (loader.SizesOf); the C headers' EG_DEFAULT_* are only the objects'
// fallbacks, held equal to these by TestDefaultTablesAreTheObjectsFallbacks.
func DefaultTables() Tables {
	return Tables{
		PerSourceEntries: 1 << 20,
		AggregateEntries: 1 << 16,
		PrefixEntries:    1 << 20,
		ListEntries:      1 << 16,
		MaxRules:         1 << 10,
		IPv4DirectChunks: 1 << 18, // as the data plane's default
		StandingEntries:  1 << 18,
	}
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	// Listen is host:port; empty disables the endpoint.
	Listen string
}

// ASNFormat is the format of the IP-to-ASN data file.
type ASNFormat string

// ASN data formats.
const (
	ASNFormatIPToASN ASNFormat = "iptoasn"
	ASNFormatMMDB    ASNFormat = "mmdb"
)

// ASNData is where IP-to-ASN (and country) data comes from.
type ASNData struct {
	Path   string
	Format ASNFormat
}

// DefaultReserve is the reserve of every aggregate bucket unless the policy
// says otherwise: 50% of its burst tolerance.
const DefaultReserve = 500_000

// Standing is the standing: section: how sources earn and lose the standing
// that lets them use an aggregate's reserve (docs/operations.md, "Standing").
type Standing struct {
	// EstablishedAfter is the clean history (at or under its own limit,
	// its aggregates not congested) a new source needs to become
	// established.
	EstablishedAfter time.Duration
	// Penalty is how long a source stays penalised after it exceeded its
	// own limit, was escalated or deny-listed.
	Penalty time.Duration
	// KnownGood are prefixes whose sources count as established from the
	// start (cold start), sorted and deduplicated.
	KnownGood []netip.Prefix
	// L7Promotion lets the L7 stage mark sources validated.
	L7Promotion L7Promotion
	// RateHistory is the half-life of a source's usual rate (a decayed
	// peak of its measured rates); 0: rates and jumps off.
	RateHistory time.Duration
	// JumpFactor: an established source whose current rate exceeds
	// JumpFactor × its usual rate (and JumpMin) has jumped, and is charged
	// as new inside an aggregate the shield tightened; 0: jumps off.
	JumpFactor float64
	// JumpMin is the least current rate that counts as a jump.
	JumpMin Rate
	// PersonalHeadroom: a privileged source has priority up to this ×
	// its mean rate (its personal budget); what it sends above is charged
	// as new (docs/operations.md, "Personal budget"). 0: budgets off,
	// privileged sources are not metered.
	PersonalHeadroom float64
	// PersonalDefault is the personal budget of a privileged source
	// without a measured mean (cold start, rates off, a rule whose
	// per-source key is not the standing key), and the least budget of a
	// vouched one (known_good, validated).
	PersonalDefault Rate
	// PersonalBurstSeconds is how many of a privileged source's busiest
	// seconds (its usual rate × this) its personal budget's burst holds.
	PersonalBurstSeconds uint32
}

// L7Promotion is standing.l7_promotion.
type L7Promotion struct {
	Enabled bool
	// Rate is the most promotions per Per the L7 stage may make.
	Rate Rate
	// When is what a request must do to promote its source:
	// PromoteAuthenticated, the only value since route_passed was removed
	// (issue 23: a bot's request passes a route's limits as easily as a
	// user's).
	When PromotionWhen
}

// PromotionWhen is standing.l7_promotion.when.
type PromotionWhen string

// What promotes a source (docs/operations.md, "L7 promotion").
const (
	// PromoteAuthenticated: a request that passed its route's limits,
	// carried a credential the route's limits key on (a header: part,
	// user or tenant) exactly once, and that the upstream answered with a
	// status from 200 to 399.
	PromoteAuthenticated PromotionWhen = "authenticated"
)

// DefaultStanding returns the standing settings a file without a standing:
// section gets.
func DefaultStanding() Standing {
	return Standing{
		EstablishedAfter: 30 * time.Second,
		Penalty:          5 * time.Minute,
		L7Promotion:      L7Promotion{Rate: Rate{Count: 100, Per: time.Second}, When: PromoteAuthenticated},
		RateHistory:      10 * time.Minute,
		JumpFactor:       4,
		JumpMin:          Rate{Count: 10, Per: time.Second},
		PersonalHeadroom: 2,
		PersonalDefault:  Rate{Count: 20, Per: time.Second},
		// Users' clumps come at random: one second of headroom × mean
		// overflows for a Poisson-clumped user about once in a hundred
		// requests.
		PersonalBurstSeconds: 2,
	}
}
