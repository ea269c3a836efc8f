package control

import (
	"context"
	"net/netip"
	"net/url"
	"strconv"
	"time"
)

// ExplainQuery is the packet `edgectl explain` asks about: a source
// address and, optionally, the protocol, ports and length the L4 rules
// and byte limits look at.
type ExplainQuery struct {
	IP    string
	Proto string // tcp, udp, icmp, icmpv6; "" for none (no L4 rule matches)
	SPort uint16
	DPort uint16 // ICMP: the type
	Len   uint32 // frame bytes; 0: 64
	TTL   uint8  // TTL or hop limit; 0: 64
	Flags uint8  // TCP flags byte (fingerprints may match it)
}

// Explanation is what the data plane would do with the next packet from
// one address, and why, read from the live maps.
type Explanation struct {
	IP     netip.Addr    `json:"ip"`
	Packet ExplainPacket `json:"packet"`
	// Verdict is pass, drop or would_drop (dry-run); Reason the counter
	// label it would be counted under (as in `edgectl stats`).
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	// Why says it in one sentence.
	Why string `json:"why"`
	// Generation is the daemon's policy generation.
	Generation uint64 `json:"generation"`
	// List is the deny or allow entry that covers the address, if any.
	List *ExplainList `json:"list,omitempty"`
	ASN  ExplainASN   `json:"asn"`
	// Rule is nil when the list decides (deny or allow) before any rule.
	Rule *ExplainRule `json:"rule,omitempty"`
	// Fingerprint is the fingerprint rule the packet matched, if any
	// (matched before any bucket).
	Fingerprint *ExplainFingerprint `json:"fingerprint,omitempty"`
	// Buckets are the steps of the packet's path, in the data plane's
	// order: the aggregates looked at before any charge (step look),
	// then the buckets charged (step charge), up to the one that refused.
	Buckets []ExplainBucket `json:"buckets"`
	// Class is the source's class as the decision saw it (new,
	// established, validated, penalised), when it looked it up; it does
	// so only at a reserve band, an override's new-source part or a
	// fingerprint's refusal.
	Class string `json:"class,omitempty"`
	// Standing is the source's standing, when the data plane keeps one.
	Standing *ExplainStanding `json:"standing,omitempty"`
	// SYN is the SYN path's view, when the policy protects TCP services.
	SYN *ExplainSYN `json:"syn,omitempty"`
	// Samples are the last drop samples the data plane sent for this
	// address (newest last), from the daemon's memory of the last ones.
	Samples []ExplainSample `json:"samples"`
	// Shield are the adaptive shield's actions on the packet's path: a
	// tightened aggregate it belongs to, or a fingerprint it matches (TTL
	// and TCP flags are not compared: the probe has none).
	Shield []ShieldAction `json:"shield,omitempty"`
	// L7 is the L7 class ranking's view of the address (nil: no L7
	// stage, or l7.classes disabled).
	L7 *ExplainL7 `json:"l7,omitempty"`
}

// ExplainL7 is what the L7 class table knows of an address as a client
// that is the TCP peer (docs/operations.md, "Class ranking at L7"), and
// the class its next request would be charged as.
type ExplainL7 struct {
	Next    string `json:"next_request_class"`
	Tracked bool   `json:"tracked"`
	History bool   `json:"history"` // L7 history (established_after without a refusal)
	// Usual and Clump are measured (else the budget is the default).
	Learned  bool    `json:"learned"`
	Usual    int64   `json:"usual_per_window"`
	Clump    int64   `json:"clump"`
	InWindow int64   `json:"in_window"`
	Budget   int64   `json:"budget"`
	Window   float64 `json:"window_s"`
}

// ExplainPacket is the probe packet.
type ExplainPacket struct {
	Proto string `json:"proto,omitempty"`
	SPort uint16 `json:"sport,omitempty"`
	DPort uint16 `json:"dport,omitempty"`
	Len   uint32 `json:"len"`
}

// ExplainList is the list entry that covers an address.
type ExplainList struct {
	List    ListKind     `json:"list"`   // deny or allow
	Prefix  netip.Prefix `json:"prefix"` // the operator's entry
	Origin  string       `json:"origin"` // policy, cli, l7
	Reason  string       `json:"reason,omitempty"`
	Expires *time.Time   `json:"expires,omitempty"`
}

// ExplainASN is what the ASN data says of the address.
type ExplainASN struct {
	// Data is false when the policy loads no ASN data; Entries is the
	// table's size when it does.
	Data    bool         `json:"data"`
	Entries int          `json:"entries,omitempty"`
	Found   bool         `json:"found"`
	Prefix  netip.Prefix `json:"prefix,omitempty"`
	ASN     uint32       `json:"asn,omitempty"`
	Country string       `json:"country,omitempty"`
	// DataPlaneASN is the ASN the data plane's prefix facts carry (what
	// the per_asn bucket is keyed by; 0: none, the bucket is skipped).
	DataPlaneASN uint32 `json:"dataplane_asn"`
}

// ExplainRule is the rule the packet is charged to and where it came from.
type ExplainRule struct {
	Name string `json:"name"`
	ID   uint32 `json:"id"`
	// From is prefix, asn, country, default or l4; Match says what
	// matched ("198.51.100.0/24", "AS64500", "ZZ", "udp src port 53").
	From   string `json:"from"`
	Match  string `json:"match,omitempty"`
	Action string `json:"action"` // limit, drop, pass
	Mode   string `json:"mode"`   // enforce or dry-run, after inheritance
}

// ExplainBucket is one bucket on the path.
type ExplainBucket struct {
	Step string `json:"step"` // look (before any charge) or charge
	Kind string `json:"kind"` // per_source, per_prefix, per_asn, global
	Key  string `json:"key"`  // 198.51.100.7/32, 198.51.100.0/24, whole, AS64500, global
	// Override is the aggregate's override in the data plane, if any:
	// its budget part replaces the policy's limit (Packets and Bytes are
	// then the override's), its new-source part is a bucket new and
	// penalised sources are charged against too.
	Override *ExplainOverride `json:"override,omitempty"`
	// NewSource says the source was charged against the override's
	// new-source part; Refused names what refused the packet: budget
	// (the bucket), reserve (its reserve band), new_source (the
	// override's new-source part).
	NewSource bool   `json:"new_source,omitempty"`
	Refused   string `json:"refused,omitempty"`
	// Uncharged says a charge step charged nothing: the bucket's key (a
	// per-source or derived prefix key not in the table) is new to the
	// new-source filter; its packet is charged when it comes again.
	Uncharged bool `json:"uncharged,omitempty"`
	// Exists is false for a bucket the table does not hold yet: it reads
	// as full.
	Exists  bool          `json:"exists"`
	Packets *ExplainLevel `json:"packets,omitempty"`
	Bytes   *ExplainLevel `json:"bytes,omitempty"`
	// Admits says whether the probe packet fits; ReserveRefuses that it
	// would fit but the bucket is in its reserve band and the source is
	// neither established nor validated.
	Admits         bool `json:"admits"`
	ReserveRefuses bool `json:"reserve_refuses,omitempty"`
}

// ExplainOverride is an aggregate override as the data plane holds it,
// per part; a part that expired is left out.
type ExplainOverride struct {
	Budget    *ExplainOverridePart `json:"budget,omitempty"`
	NewSource *ExplainOverridePart `json:"new_source,omitempty"`
}

// ExplainOverridePart is one part of an override: its writer (shield,
// fleet, cli), expiry, limit and, for the new-source part, its bucket.
type ExplainOverridePart struct {
	Origin  string        `json:"origin"`
	Expires *time.Time    `json:"expires,omitempty"` // nil: never
	Limit   string        `json:"limit"`
	Packets *ExplainLevel `json:"packets,omitempty"`
}

// ExplainFingerprint is a fingerprint rule a packet matched.
type ExplainFingerprint struct {
	ID      uint32        `json:"id"`
	Match   string        `json:"match"`
	Origin  string        `json:"origin"`
	DryRun  bool          `json:"dry_run,omitempty"`
	Expires *time.Time    `json:"expires,omitempty"`
	Packets *ExplainLevel `json:"packets,omitempty"` // nil: no budget, every match is refused
	// Refused: its bucket has no room; Dropped: so the packet is dropped
	// (fingerprint); Spared: refused, but the source is validated.
	Refused bool `json:"refused"`
	Dropped bool `json:"dropped"`
	Spared  bool `json:"spared,omitempty"`
}

// ExplainLevel is one dimension of a bucket: its limit as the policy
// writes it, the burst tolerance and what is available now, in packets or
// bytes (exact to a tick of the emission interval).
type ExplainLevel struct {
	Limit     string  `json:"limit"` // "200/s burst 400"
	Burst     float64 `json:"burst"`
	Available float64 `json:"available"`
	// Reserve is the part of Burst only established and validated
	// sources may use (0: no reserve).
	Reserve float64 `json:"reserve,omitempty"`
}

// ExplainStanding is a source's standing.
type ExplainStanding struct {
	Standing string     `json:"standing"` // new, established, validated, penalised
	Why      string     `json:"why,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	Tracked  bool       `json:"tracked"`
	// Rate is the source's usual and current rate (docs/operations.md,
	// "Usual rate"), once one was measured.
	Rate *ExplainRate `json:"rate,omitempty"`
	// Next is the class the source's next packet would be charged as if
	// it met an aggregate's reserve band (established, validated,
	// over_budget, new, penalised), computed by the reference model.
	Next string `json:"next_class,omitempty"`
	// Budget is its personal budget, for an established or validated
	// source while budgets are on (docs/operations.md, "Personal budget").
	Budget *ExplainBudget `json:"personal_budget,omitempty"`
}

// ExplainBudget is a privileged source's personal budget: packets per
// second and burst (packets), and how full the burst would be with its
// next packet (0 to 1; at 1 that packet is over: charged as new, class
// over_budget).
type ExplainBudget struct {
	Rate  float64 `json:"rate"`
	Burst float64 `json:"burst"`
	InUse float64 `json:"in_use"`
}

// ExplainRate is a source's usual rate (a decayed peak of its measured
// rates), its last measured rate, packets per second, and whether it
// jumped (current > jump_factor × usual: charged as new inside aggregates
// the shield tightened, if established).
type ExplainRate struct {
	Usual    float64 `json:"usual"`
	Current  float64 `json:"current"`
	Jumped   bool    `json:"jumped"`
	Measured float64 `json:"measured_ago_s"` // seconds since the last measurement
}

// ExplainSample is one drop sample of the address.
type ExplainSample struct {
	Time   time.Time `json:"time"`
	Action string    `json:"action"`
	Reason string    `json:"reason"`
	Rule   string    `json:"rule"`
	Proto  uint8     `json:"proto"`
	SPort  uint16    `json:"sport"`
	DPort  uint16    `json:"dport"`
	Len    uint16    `json:"len"`
}

// Explain asks the daemon what it would do with q's packet.
func (c *Client) Explain(ctx context.Context, q ExplainQuery) (Explanation, error) {
	var e Explanation
	v := url.Values{"ip": {q.IP}}
	if q.Proto != "" {
		v.Set("proto", q.Proto)
	}
	if q.SPort != 0 {
		v.Set("sport", strconv.Itoa(int(q.SPort)))
	}
	if q.DPort != 0 {
		v.Set("dport", strconv.Itoa(int(q.DPort)))
	}
	if q.Len != 0 {
		v.Set("len", strconv.Itoa(int(q.Len)))
	}
	if q.TTL != 0 {
		v.Set("ttl", strconv.Itoa(int(q.TTL)))
	}
	if q.Flags != 0 {
		v.Set("flags", strconv.Itoa(int(q.Flags)))
	}
	return e, c.do(ctx, "GET", "/v1/explain", v, nil, &e)
}
