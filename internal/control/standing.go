package control

import "time"

// StandingStats is the standing section of stats and status: how the
// aggregates' reserves are used (docs/operations.md, "Standing").
type StandingStats struct {
	// Congestion is each aggregate kind's congestion state: congested
	// while it refuses new sources (the reserve is in use).
	Congestion []Congestion `json:"congestion"`
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
