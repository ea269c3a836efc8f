package control

import "time"

// StandingStats is the standing section of stats and status: how the
// aggregates' reserves are used (docs/operations.md, "Standing").
type StandingStats struct {
	// Congestion is each aggregate kind's congestion state: congested
	// while it refuses new sources (the reserve is in use).
	Congestion []Congestion `json:"congestion"`
	// Instances are the single aggregates (an ASN, a prefix, a rule's
	// whole aggregate, the global bucket) refusing sources now, from the
	// drop samples, most-refusing first, at most 64.
	Instances []CongestedInstance `json:"instances,omitempty"`
	// Classes are the class counters of congested aggregates, non-zero
	// only.
	Classes []ClassStat `json:"classes"`
	// Events count the standing table's changes: created, table_full,
	// established, penalised.
	Events map[string]uint64 `json:"events"`
}

// Congestion is one aggregate kind's (prefix, asn, global) congestion state.
type Congestion struct {
	Aggregate string    `json:"aggregate"`
	Congested bool      `json:"congested"`
	Since     time.Time `json:"since,omitzero"`
	For       Duration  `json:"for,omitzero"`
	// AdmittedByClass is what the aggregate admitted per class since the
	// congestion began ("unknown": admitted below the reserve band without
	// a standing lookup, at a moment the aggregate was not congested).
	AdmittedByClass map[string]uint64 `json:"admitted_by_class,omitempty"`
}

// ClassStat is one class counter: packets at a congested aggregate, by
// class and outcome (admitted, admitted_reserve, refused_reserve,
// refused_full); mode dry-run counts would-drops of dry-run rules.
type ClassStat struct {
	Aggregate string `json:"aggregate"`
	Class     string `json:"class"`
	Outcome   string `json:"outcome"`
	Mode      string `json:"mode"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// CongestedInstance is one aggregate instance that is refusing sources:
// seen refusing in the drop samples, and not yet calm for 5 s
// (docs/operations.md, "Congestion of one aggregate"). The counts are
// drop samples (at most 1,000/s over every drop of the host), not
// packets.
type CongestedInstance struct {
	Aggregate string `json:"aggregate"`        // prefix, asn or global
	Rule      string `json:"rule,omitempty"`   // the rule whose aggregate it is (not for global)
	ASN       uint32 `json:"asn,omitempty"`    // aggregate asn
	Prefix    string `json:"prefix,omitempty"` // aggregate prefix: the derived prefix, or "whole"
	// Since is the first refusal sampled; LastRefused the last.
	Since       time.Time `json:"since"`
	For         Duration  `json:"for"`
	LastRefused time.Time `json:"last_refused"`
	// RefusedReserve and RefusedFull count the sampled refusals: by the
	// reserve (new and penalised sources only), and by a full bucket
	// (everyone). RefusedByClass splits them by the refused source's class
	// ("unknown": a full bucket looks no standing up).
	RefusedReserve uint64            `json:"refused_reserve_sampled"`
	RefusedFull    uint64            `json:"refused_full_sampled"`
	RefusedByClass map[string]uint64 `json:"refused_by_class_sampled,omitempty"`
	// RefusedByReason splits them by drop reason, that is by who decided:
	// the policy's budget (prefix_limit, asn_limit, global_limit) or an
	// override part on the instance (shield_tighten, fleet_share,
	// override).
	RefusedByReason map[string]uint64 `json:"refused_by_reason_sampled,omitempty"`
	// Share is this instance's part of its kind's sampled refusals among
	// the tracked instances (0-1).
	Share float64 `json:"share"`
	// Overcount: up to this many refusals counted for the instance may be
	// of instances it replaced in the bounded table (0 while fewer than 64
	// instances refuse).
	Overcount uint64 `json:"overcount,omitempty"`
}
