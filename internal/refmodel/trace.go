package refmodel

import (
	"net/netip"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// Trace is what one packet's decision read, step by step in the program's
// order, with the state of each table entry as it found it: what `edgectl
// explain` prints. It is recorded by Explain and by nothing else (Run pays
// one nil check per step).
type Trace struct {
	// List is the lists entry the address matched (deny and allow
	// inheritance folded in, as the trie holds it), nil: none.
	List *maps.ListEntry
	// Fact is the prefix fact that named the rule, nil: none covers the
	// address (the default rule, the program's slot 0).
	Fact *TraceFact
	// L4 is the L4 entry that replaced the fact's rule, nil: none.
	L4 *TraceL4
	// Rule is the rule the packet was charged to, nil: none (no_policy,
	// or decided by a list).
	Rule *TraceRule
	// Fingerprint is the fingerprint that matched, nil: none.
	Fingerprint *TraceFingerprint
	// Buckets are the aggregates looked at (before any charge) and then
	// the buckets charged, in order, up to the one that refused.
	Buckets []BucketStep
	// Class is the source's class, when the decision looked it up (an
	// override's new-source part, a reserve band, a fingerprint's
	// refusal); Jumped says its standing entry says jumped.
	Class  *maps.Class
	Jumped bool
}

// TraceFact is a prefix fact: the trie's prefix and what it names.
type TraceFact struct {
	Prefix netip.Prefix
	RuleID uint32
	ASN    uint32
}

// TraceL4 is an L4 entry that matched.
type TraceL4 struct {
	Proto  uint8
	Dir    maps.L4Dir
	Port   uint16
	RuleID uint32
}

// TraceRule is the rule as the data plane holds it.
type TraceRule struct {
	ID                   uint32
	Action               maps.RuleAction
	Mode, GenerationMode maps.Mode
}

// TraceFingerprint is the fingerprint that matched the packet, as it was
// before the packet (Val.Bucket is its bucket then).
type TraceFingerprint struct {
	Key FpKey
	Val FpVal
	// Refused: its bucket had no room (or it has no budget); Dropped: so
	// the packet is dropped; Spared: refused, but the source is
	// validated; a dry-run one refuses without dropping.
	Refused, Dropped, Spared bool
}

// Step phases: an aggregate is first looked at without charging (peek),
// then every bucket is charged most specific first.
const (
	stepPeek   = false
	stepCharge = true
)

// BucketStep is one bucket on the packet's path.
type BucketStep struct {
	// Charge: the charge; else the look before any charge.
	Charge bool
	// Kind is the aggregate's kind (AggKindPrefix, ASN, Whole, Global)
	// in Agg, or 0 for the per-source bucket (Src).
	Kind uint8
	Agg  AggKey
	Src  SrcKey
	// Exists: the table held the entry (whole and global buckets always
	// exist; a zero one is full).
	Exists bool
	Bucket Bucket // as found
	// Policy is the policy's budget and Reserve its reserve share (of
	// 65536); Override the aggregate's override, nil: none (or its gate
	// bit is clear, so the program does not look).
	Policy   maps.BucketCfg
	Reserve  uint16
	Override *Override
	// BudgetPart: the override's budget replaced Policy; NewPart: the
	// source was charged against the override's new-source bucket, and
	// RefusedNew: that bucket refused it.
	BudgetPart, NewPart, RefusedNew bool
	// Seen is the new-source filter's answer (-1: not asked; SeenNew:
	// passed uncharged); Charged whether the bucket was charged at all
	// (an aggregate step is charged unless Seen is SeenNew).
	Seen    int
	Charged bool
	// Admitted, or refused with Outcome (maps.OutcomeRefused*).
	Admitted bool
	Outcome  maps.Outcome
}

// Answers of the new-source filter, for BucketStep.Seen.
const (
	SeenNew      = seenNew
	SeenDeferred = seenDeferred
	SeenActive   = seenActive
)

// Explain decides one parsed packet at nowNS, as Run would (the state
// changes as if it arrived; counters do not), and returns the verdict and
// what the decision read. Meant for a model loaded for the question
// (FromState): `edgectl explain`.
func (m *Model) Explain(pi Packet, nowNS uint64) (Verdict, Trace) {
	var t Trace
	m.trace = &t
	defer func() { m.trace = nil }()
	v := m.decidePacket(pi, nowNS)
	return v, t
}

// ProbePacket is the packet explain asks about: from addr, of protocol
// proto (0: none the L4 rules or fingerprints can name) with its ports
// (ICMP: dport is the type), a frameLen-byte Ethernet frame without VLAN
// tags, TTL ttl and TCP flags flags.
func ProbePacket(addr netip.Addr, proto uint8, sport, dport uint16, frameLen uint32, ttl, flags uint8) Packet {
	p := Packet{Addr: maps.Addr16(addr), Len: frameLen, Proto: proto, TTL: ttl}
	if frameLen > 14 {
		p.IPLen = uint16(min(frameLen-14, 65535))
	}
	switch proto {
	case protoTCP, protoUDP, protoICMP, protoICMPv6:
		p.HasL4, p.SrcPort, p.DstPort = true, sport, dport
		if proto == protoICMP || proto == protoICMPv6 {
			p.SrcPort = 0
		}
	}
	if proto == protoTCP {
		p.TCPFlags = flags
	}
	return p
}

func (m *Model) traceList(e maps.ListEntry) {
	if m.trace != nil {
		m.trace.List = &e
	}
}

func (m *Model) traceFact(f fact, ok bool) {
	if m.trace != nil && ok {
		m.trace.Fact = &TraceFact{RuleID: f.ruleID, ASN: f.asn, Prefix: f.prefix}
	}
}

func (m *Model) traceL4(pi Packet, id uint32) {
	if m.trace == nil {
		return
	}
	g := m.gen
	for _, k := range []l4Key{{pi.Proto, maps.L4Src, pi.SrcPort}, {pi.Proto, maps.L4Dst, pi.DstPort}, {pi.Proto, maps.L4Any, 0}} {
		if k.dir != maps.L4Any && !pi.HasL4 {
			continue
		}
		if got, ok := g.l4[k]; ok && got == id {
			m.trace.L4 = &TraceL4{Proto: k.proto, Dir: k.dir, Port: k.port, RuleID: id}
			return
		}
	}
}

func (m *Model) traceRule(r *rule) {
	if m.trace != nil {
		m.trace.Rule = &TraceRule{ID: r.id, Action: r.action, Mode: r.mode, GenerationMode: m.gen.mode}
	}
}

func (m *Model) traceClass(cls maps.Class, jumped bool) {
	if m.trace != nil {
		m.trace.Class, m.trace.Jumped = &cls, jumped
	}
}

func (m *Model) traceFingerprint(k FpKey, before FpVal, refused, dropped, spared bool) {
	if m.trace != nil {
		m.trace.Fingerprint = &TraceFingerprint{Key: k, Val: before, Refused: refused, Dropped: dropped, Spared: spared}
	}
}

func (m *Model) traceSource(k SrcKey, b Bucket, exists bool, seen int, charged, ok bool, c maps.BucketCfg) {
	if m.trace == nil {
		return
	}
	st := BucketStep{Charge: true, Src: k, Exists: exists, Bucket: b, Policy: c, Seen: seen, Charged: charged, Admitted: ok}
	if !ok {
		st.Outcome = maps.OutcomeRefusedFull
	}
	m.trace.Buckets = append(m.trace.Buckets, st)
}

// traceUncharged is a derived aggregate not in the table whose key is
// new to the new-source filter: not created, not charged.
func (m *Model) traceUncharged(k AggKey, c maps.BucketCfg, reserve uint16) {
	if m.trace != nil {
		m.trace.Buckets = append(m.trace.Buckets, BucketStep{Charge: true, Kind: k.Kind, Agg: k, Policy: c, Reserve: reserve,
			Seen: SeenNew, Admitted: true})
	}
}

// traceAgg starts the step of an aggregate (nil when not tracing; the
// step's methods accept nil).
func (m *Model) traceAgg(charge bool, k AggKey, b Bucket, c maps.BucketCfg, reserve uint16, o *Override, ss *srcState) *BucketStep {
	if m.trace == nil {
		return nil
	}
	st := BucketStep{Charge: charge, Kind: k.Kind, Agg: k, Exists: true, Bucket: b, Policy: c, Reserve: reserve, Seen: -1, Charged: charge}
	if k.Kind == AggKindPrefix || k.Kind == AggKindASN {
		_, st.Exists = m.agg[k]
	}
	if o != nil {
		oc := *o
		st.Override = &oc
		st.BudgetPart = o.Expires > ss.now>>maps.TickShift && limited(o.Budget)
	}
	m.trace.Buckets = append(m.trace.Buckets, st)
	return &m.trace.Buckets[len(m.trace.Buckets)-1]
}

func (st *BucketStep) newPart() {
	if st != nil {
		st.NewPart = true
	}
}

func (st *BucketStep) refusedNew() {
	if st != nil {
		st.RefusedNew, st.Outcome = true, maps.OutcomeRefusedFull
	}
}

func (st *BucketStep) done(ok bool, ss *srcState) {
	if st != nil {
		st.Admitted = ok
		if !ok {
			st.Outcome = ss.refusedOutcome
		}
	}
}
