// Package refmodel is a Go reference model of the XDP limiter's whole
// per-packet decision (bpf/xdp_limiter.c): parse the frame, consult the
// lists, find the prefix facts by longest prefix match, let L4 rules
// override the rule, peek and then charge the buckets, and count the
// verdict. State lives in Go maps and time is an explicit clock in ns, so
// tests can run the same packet sequence through the model and through the
// program (BPF_PROG_TEST_RUN) and require the same verdicts, counters and
// bucket states. The SYN path in front of it (bpf/syncookie.c, XDP part)
// has its model in syn.go (LoadSyn, DecideSYN), on the same lists and
// standing table; a segment it continues goes on to Run.
//
// The model is written from the C, statement by statement, not from the
// documentation: where the two disagree the model follows the program, and
// tests that check the documented behaviour live next to the program.
//
// What it leaves out, on purpose:
//   - drop samples (the ring buffer and its budget): they change no verdict;
//   - the gate words of overrides: maps.Maps keeps a bit set for every
//     override, so the model looks each aggregate's override up directly;
//   - aggregate watches (agg_stats counters): they change no verdict;
//   - LRU eviction: tables are unbounded Go maps, so runs compared with the
//     program must stay far below its table sizes;
//   - concurrency: one packet at a time, so a GCRA compare-and-swap never
//     fails (the program rejects after EG_CAS_RETRIES lost races);
//   - table slots of rules: counters and whole-aggregate buckets (which
//     the program keeps by slot) follow the rule id and restart when an id
//     leaves and comes back, as maps.Generations.Stage and Commit make the program do.
//
// State per key is one Bucket (two uint64 TATs) plus the Go map overhead;
// the model is meant for tests, not for production-sized tables.
package refmodel

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Key and state types are the ones bpf2go generated from the C, so a model
// state compares directly with a map dump.
type (
	// SrcKey keys a per-source bucket.
	SrcKey = loader.LimiterEgSrcKey
	// AggKey keys a prefix or ASN aggregate bucket.
	AggKey = loader.LimiterEgAggKey
	// Bucket is the GCRA state of one bucket (packet and byte TATs, ticks).
	Bucket = loader.LimiterEgBucket
)

// Aggregate kinds (enum eg_agg_kind).
const (
	AggKindPrefix = uint8(loader.LimiterEgAggKindEG_AGG_KIND_PREFIX)
	AggKindASN    = uint8(loader.LimiterEgAggKindEG_AGG_KIND_ASN)
)

// Verdict is the model's answer for one packet.
type Verdict struct {
	Action maps.Action
	Reason maps.Reason
	RuleID uint32 // the rule the packet was charged under, when Counted
	// Counted says the packet went to the rule's counters.
	Counted bool
	// Refused is what the drop sample says (struct eg_sample's refused and
	// refused_agg): the outcome at the aggregate that refused the packet
	// (maps.OutcomeRefused*; 0: no aggregate refused it) and that
	// aggregate's kind, which an override's reason (shield_tighten,
	// fleet_share, override) does not name.
	Refused    maps.Outcome
	RefusedAgg maps.ClassAgg
}

// Passes reports whether the program would return XDP_PASS.
func (v Verdict) Passes() bool { return v.Action != maps.ActDrop }

func (v Verdict) String() string {
	s := maps.ActionName(v.Action) + "/" + maps.ReasonName(v.Reason)
	if v.Counted {
		s += fmt.Sprintf(" rule %d", v.RuleID)
	}
	return s
}

type rule struct {
	id                    uint32
	src, agg, asn         maps.BucketCfg
	srcLen4, srcLen6      uint8
	aggLen4, aggLen6      uint8
	aggMode               maps.AggMode
	mode                  maps.Mode
	action                maps.RuleAction
	srcLim, aggLim, asLim bool
	reserve               uint16
}

type l4Key struct {
	proto uint8
	dir   maps.L4Dir
	port  uint16
}

type prefixKey struct {
	addr [16]byte
	bits int // in the 128-bit space
}

type fact struct {
	ruleID, asn uint32
	prefix      netip.Prefix // for Trace
}

type generation struct {
	mode      maps.Mode
	malformed maps.Action
	global    maps.BucketCfg
	globalLim bool
	l4Protos  uint8
	reserve   uint16 // the global bucket's
	// defaultRule is the rule of an address no fact covers (the program's
	// slot 0): id 0 after Apply; FromState reads it from the slot.
	defaultRule uint32
	standing    loader.LimiterEgStandingCfg
	rules       map[uint32]rule
	l4          map[l4Key]uint32
	prefixes    lpmTable[fact]
}

// Model is the reference model of one loaded program: its policy, lists,
// bucket tables and counters. It is not safe for concurrent use.
type Model struct {
	maxRules uint32
	gen      *generation // nil until the first Apply
	lists    lpmTable[maps.ListEntry]
	src      map[SrcKey]Bucket
	srcPkts  map[SrcKey]uint32 // eg_src_bucket.pkts, beside src
	agg      map[AggKey]Bucket
	whole    map[uint32]Bucket // whole aggregates by rule id
	global   Bucket
	counters maps.Counters
	rules    map[uint32]maps.RuleCounters
	seen     map[uint32]uint64 // new-source filter words
	seenMask uint32
	// Standing (standing.go): the table, known_good, and counters.
	standing  map[StandingKey]StandingVal
	knownGood lpmTable[bool]
	classes   maps.ClassCounters
	events    maps.StandingCounts
	ovr       map[AggKey]Override // aggregate overrides (overrides.go)
	fp        *fpState            // fingerprint rules (fingerprint.go)
	// gate is agg_gate by rule id (FromState); nil: every bit set (Apply
	// and SetOverride keep no gate, as maps.Maps keeps a bit for every
	// override).
	gate  map[uint32]uint32
	trace *Trace      // non-nil during Explain
	live  *liveTables // FromState: the program's large tables, looked up as needed
	syn   *synTables  // the SYN path's maps (LoadSyn, syn.go)
}

// New returns a model of a program loaded with room for maxRules rules
// (loader.Sizes.MaxRules) and srcEntries per-source buckets (which size
// its new-source filter), with no policy, empty lists and empty tables.
// Rule ids are the policy's (any 32-bit value); the table slots the
// program keeps them in are not modelled, only their effect on counters.
func New(maxRules, srcEntries uint32) *Model {
	return &Model{
		maxRules: maxRules,
		seen:     map[uint32]uint64{},
		seenMask: loader.SeenFilterWords(srcEntries) - 1,
		src:      map[SrcKey]Bucket{},
		srcPkts:  map[SrcKey]uint32{},
		agg:      map[AggKey]Bucket{},
		whole:    map[uint32]Bucket{},
		rules:    map[uint32]maps.RuleCounters{},
		standing: map[StandingKey]StandingVal{},
	}
}

// ErrInvalidGeneration wraps every reason Apply refuses a generation.
var ErrInvalidGeneration = errors.New("invalid generation")

func l4Bit(proto uint8) uint8 { return maps.L4Bit(proto) }

// Apply makes g the live policy, as maps.Generations.Stage and Commit do: rules, settings,
// L4 matches and prefix facts are replaced together; bucket state, lists
// and counters stay. It refuses what maps.Generations.Stage refuses.
func (m *Model) Apply(g *policy.Compiled) error {
	n := &generation{rules: map[uint32]rule{}, l4: map[l4Key]uint32{}}
	facts := map[prefixKey]fact{}
	if uint32(len(g.Rules)) > m.maxRules {
		return fmt.Errorf("%w: %d rules, the table holds %d", ErrInvalidGeneration, len(g.Rules), m.maxRules)
	}
	// The data plane's form of each rule and of the settings comes from
	// internal/maps (the one compiler of policy into map values); what
	// the model implements is what the program does with them.
	for _, r := range g.Rules {
		if _, dup := n.rules[r.ID]; dup {
			return fmt.Errorf("%w: rule id %d used twice", ErrInvalidGeneration, r.ID)
		}
		v, err := maps.RuleConfig(r)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidGeneration, err)
		}
		n.rules[r.ID] = ruleOf(v)
	}
	for _, l := range g.L4 {
		if _, ok := n.rules[l.RuleID]; !ok {
			return fmt.Errorf("%w: l4 match names unknown rule %d", ErrInvalidGeneration, l.RuleID)
		}
		if l4Bit(l.Protocol) == 0 {
			return fmt.Errorf("%w: l4 match: protocol %d", ErrInvalidGeneration, l.Protocol)
		}
		dir, err := maps.L4DirOf(l.Dir)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidGeneration, err)
		}
		n.l4Protos |= l4Bit(l.Protocol)
		k := l4Key{proto: l.Protocol, dir: dir, port: l.Port}
		if dir == maps.L4Any {
			k.port = 0
		}
		n.l4[k] = l.RuleID
	}
	cfg, err := maps.SettingsConfig(g, n.l4Protos)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidGeneration, err)
	}
	n.settings(cfg, maps.StandingConfig(g.Standing))
	kg := map[prefixKey]bool{}
	for _, p := range g.Standing.KnownGood {
		if !p.IsValid() {
			return fmt.Errorf("%w: standing.known_good: invalid prefix", ErrInvalidGeneration)
		}
		kg[keyOf(p)] = true
	}
	for _, f := range g.Prefixes {
		if !f.Prefix.IsValid() {
			return fmt.Errorf("%w: invalid prefix in prefix facts", ErrInvalidGeneration)
		}
		facts[keyOf(f.Prefix)] = fact{ruleID: f.RuleID, asn: f.ASN, prefix: f.Prefix.Masked()}
	}
	n.prefixes = newLPMTable(facts)
	m.gen = n
	m.pruneOverrides()
	m.knownGood = newLPMTable(kg)
	// Rule counters and whole-aggregate buckets live in table slots that
	// survive with the rule id (maps.Generations.Stage); a rule that leaves and
	// comes back starts at zero, with a full bucket.
	for id := range m.rules {
		if _, ok := n.rules[id]; !ok {
			delete(m.rules, id)
		}
	}
	for id := range m.whole {
		if _, ok := n.rules[id]; !ok {
			delete(m.whole, id)
		}
	}
	return nil
}

// ruleOf is the model's form of a rules table entry: one line per field
// the decision reads (Apply and FromState both come through here).
func ruleOf(v loader.LimiterEgRule) rule {
	c := rule{id: v.Id, srcLen4: v.SrcLen4, srcLen6: v.SrcLen6, aggLen4: v.AggLen4, aggLen6: v.AggLen6,
		aggMode: maps.AggMode(v.AggMode), mode: maps.Mode(v.Mode), action: maps.RuleAction(v.Action),
		src: v.Src, agg: v.Agg, asn: v.Asn, reserve: v.Reserve}
	c.srcLim, c.aggLim, c.asLim = limited(c.src), limited(c.agg), limited(c.asn)
	return c
}

// settings takes a generation's config and standing settings as the data
// plane's tables hold them (Apply and FromState both come through here).
func (g *generation) settings(cfg loader.LimiterEgConfig, st loader.LimiterEgStandingCfg) {
	g.mode, g.malformed = maps.Mode(cfg.Mode), maps.Action(cfg.MalformedVerdict)
	g.global, g.reserve = cfg.Global, cfg.Reserve
	g.globalLim = limited(g.global)
	g.l4Protos = cfg.L4Protos
	g.standing = st
}

// SetLists makes the lists hold exactly want, as maps.ListStore.Set does.
func (m *Model) SetLists(want []maps.ListEntry) error {
	next := make(map[prefixKey]maps.ListEntry, len(want))
	for _, e := range want {
		k := keyOf(e.Prefix)
		if _, dup := next[k]; dup {
			return fmt.Errorf("list entry %s given twice", e.Prefix.Masked())
		}
		next[k] = e
	}
	m.lists = newLPMTable(next)
	return nil
}

func keyOf(p netip.Prefix) prefixKey {
	k := maps.LPMKey(p)
	return prefixKey{addr: k.Addr, bits: int(k.Prefixlen)}
}

// lpmTable answers longest-prefix-match lookups as an LPM trie does for
// a /128 key. Entries are kept most specific first, in a fixed order, so a
// lookup is deterministic (the fuzzer wants repeatable coverage).
type lpmTable[V any] []lpmEntry[V]

type lpmEntry[V any] struct {
	key prefixKey
	val V
}

func newLPMTable[V any](m map[prefixKey]V) lpmTable[V] {
	t := make(lpmTable[V], 0, len(m))
	for k, v := range m {
		t = append(t, lpmEntry[V]{key: k, val: v})
	}
	slices.SortFunc(t, func(a, b lpmEntry[V]) int {
		if c := cmp.Compare(b.key.bits, a.key.bits); c != 0 {
			return c
		}
		return bytes.Compare(a.key.addr[:], b.key.addr[:])
	})
	return t
}

func (t lpmTable[V]) lookup(addr [16]byte) (V, bool) {
	for _, e := range t {
		if maskAddr(addr, e.key.bits) == e.key.addr {
			return e.val, true
		}
	}
	var zero V
	return zero, false
}

// maskAddr keeps the first n bits (0-128) of a 16-byte address.
func maskAddr(a [16]byte, n int) [16]byte {
	var out [16]byte
	for i := range 16 {
		switch {
		case n >= 8*(i+1):
			out[i] = a[i]
		case n > 8*i:
			out[i] = a[i] & ^byte(0xff>>(n-8*i))
		}
	}
	return out
}

func isV4Mapped(a [16]byte) bool {
	return a == [16]byte{10: 0xff, 11: 0xff, 12: a[12], 13: a[13], 14: a[14], 15: a[15]}
}

func limited(c maps.BucketCfg) bool { return c.PktT != 0 || c.ByteT != 0 }

func wouldAdmit(b Bucket, c maps.BucketCfg, now uint64, n uint32) bool {
	if c.PktT != 0 && !(maps.GCRA{TAT: b.PktTat}).WouldAdmit(now, c.PktT, c.PktTau) {
		return false
	}
	if c.ByteT != 0 && !(maps.GCRA{TAT: b.ByteTat}).WouldAdmit(now, maps.ByteCost(c, n), c.ByteTau) {
		return false
	}
	return true
}

// take charges both dimensions or neither, with the program's refund: a
// packet the byte dimension rejects gives back its packet charge by
// subtraction (which leaves max(old TAT, now), not the old TAT).
func take(b *Bucket, c maps.BucketCfg, now uint64, n uint32) bool {
	if c.PktT != 0 && !gcraTake(&b.PktTat, now, c.PktT, c.PktTau) {
		return false
	}
	if c.ByteT != 0 && !gcraTake(&b.ByteTat, now, maps.ByteCost(c, n), c.ByteTau) {
		if c.PktT != 0 {
			b.PktTat -= c.PktT
		}
		return false
	}
	return true
}

// gcraTake admits an event of cost inc at now iff it fits the tolerance
// tau (maps.GCRA.WouldAdmit), and then charges it, as the program's GCRA
// does; a rejected event changes nothing.
func gcraTake(tat *uint64, now, inc, tau uint64) bool {
	if !(maps.GCRA{TAT: *tat}).WouldAdmit(now, inc, tau) {
		return false
	}
	*tat = max(*tat, now) + inc
	return true
}

// Run decides one frame at time nowNS (the test clock), updates the state
// and counters, and returns the verdict.
func (m *Model) Run(frame []byte, nowNS uint64) Verdict {
	v := m.decide(frame, nowNS)
	n := uint64(len(frame))
	c := &m.counters[v.Action][v.Reason]
	c.Packets++
	c.Bytes += n
	if v.Counted {
		rc := m.rules[v.RuleID]
		rc[v.Action].Packets++
		rc[v.Action].Bytes += n
		m.rules[v.RuleID] = rc
	}
	return v
}

func (m *Model) decide(frame []byte, nowNS uint64) Verdict {
	pi, reason := Parse(frame)
	switch reason {
	case maps.ReasonOK:
	case maps.ReasonNonIP:
		return Verdict{Action: maps.ActPass, Reason: maps.ReasonNonIP}
	default:
		v := Verdict{Action: maps.ActPass, Reason: reason}
		if g := m.gen; g != nil && g.malformed == maps.ActDrop {
			v.Action = maps.ActDrop
			if g.mode == maps.ModeDryRun {
				v.Action = maps.ActWouldDrop
			}
		}
		return v
	}
	return m.decidePacket(pi, nowNS)
}

// decidePacket is the decision of a parsed IP packet.
func (m *Model) decidePacket(pi Packet, nowNS uint64) Verdict {
	g := m.gen
	if g == nil {
		return Verdict{Action: maps.ActPass, Reason: maps.ReasonNoPolicy}
	}
	now := nowNS << maps.TickShift

	// 1. Lists: the most specific entry answers.
	if e, ok := m.lists.lookup(pi.Addr); ok {
		m.traceList(e)
		if e.DenyUntil > nowNS {
			v := Verdict{Action: maps.ActDrop, Reason: maps.ReasonDeny}
			if g.mode == maps.ModeDryRun {
				v.Action = maps.ActWouldDrop
			}
			return v
		}
		if e.AllowUntil > nowNS {
			return Verdict{Action: maps.ActPass, Reason: maps.ReasonAllow}
		}
	}

	// 2. Prefix facts, 3. L4 override.
	f, ok := g.prefixes.lookup(pi.Addr)
	if !ok {
		f.ruleID = g.defaultRule
	}
	ruleID, asn := f.ruleID, f.asn
	m.traceFact(f, ok)
	if g.l4Protos&l4Bit(pi.Proto) != 0 {
		if id, ok := g.l4Rule(pi); ok {
			ruleID = id
			m.traceL4(pi, id)
		}
	}
	// A fact or L4 match naming no rule of this generation points past
	// the rules table in the program: no_policy.
	r, ok := g.rules[ruleID]
	if !ok {
		return Verdict{Action: maps.ActPass, Reason: maps.ReasonNoPolicy}
	}
	m.traceRule(&r)
	v := Verdict{Action: maps.ActPass, Reason: maps.ReasonOK, RuleID: ruleID, Counted: true}
	switch r.action {
	case maps.RulePass:
		v.Reason = maps.ReasonRulePass
		return v
	case maps.RuleDrop:
		return m.limited(v, maps.ReasonRuleDrop, &r, nil)
	}
	v4 := isV4Mapped(pi.Addr)

	ss := &srcState{now: now, addr: pi.Addr, len: pi.Len, v4: v4, ruleID: r.id}

	// Fingerprint rules, before any bucket.
	if m.fingerprint(pi, ss) {
		return m.limited(v, maps.ReasonFingerprint, &r, ss)
	}

	// 4. Peek at the aggregates without creating anything.
	var ak, nk AggKey
	if g.globalLim && !m.ovrPeek(AggKey{Kind: AggKindGlobal}, m.global, g.global, g.reserve, maps.ClassAggGlobal, ss) {
		return m.limited(v, maps.ReasonGlobalLimit, &r, ss)
	}
	if asn != 0 && r.asLim {
		nk = AggKey{RuleId: r.id, Kind: AggKindASN, Asn: asn}
		m.faultAgg(nk)
		if nb, ok := m.agg[nk]; ok && !m.ovrPeek(nk, nb, r.asn, r.reserve, maps.ClassAggASN, ss) {
			return m.limited(v, maps.ReasonASNLimit, &r, ss)
		}
	}
	if r.aggMode != maps.AggNone && r.aggLim {
		if r.aggMode != maps.AggDerived {
			// Whole: an array slot, always there (zero is a full
			// bucket), so it is always peeked at.
			if !m.ovrPeek(AggKey{RuleId: r.id, Kind: AggKindWhole}, m.whole[r.id], r.agg, r.reserve, maps.ClassAggPrefix, ss) {
				return m.limited(v, maps.ReasonPrefixLimit, &r, ss)
			}
		} else {
			n := int(min(r.aggLen6, 128))
			if v4 {
				n = 96 + int(min(r.aggLen4, 32))
			}
			ak = AggKey{RuleId: r.id, Kind: AggKindPrefix, Addr: maskAddr(pi.Addr, n), Len: uint8(n)}
			m.faultAgg(ak)
			if ab, ok := m.agg[ak]; ok && !m.ovrPeek(ak, ab, r.agg, r.reserve, maps.ClassAggPrefix, ss) {
				return m.limited(v, maps.ReasonPrefixLimit, &r, ss)
			}
		}
	}

	// Then charge, most specific first. A bucket created without the
	// new-source filter starts at TAT 0.
	if r.srcLim {
		n := int(min(r.srcLen6, 128))
		if v4 {
			n = 96 + int(min(r.srcLen4, 32))
		}
		sk := SrcKey{RuleId: r.id, Addr: maskAddr(pi.Addr, n)}
		m.faultSrc(sk)
		b, have := m.src[sk]
		before, existed, seen := b, have, -1
		ss.srckey = (v4 && r.srcLen4 == 32) || (!v4 && r.srcLen6 == 64)
		if !gated(r.src) {
			have = true
		} else {
			// The new-source filter first: a key not seen in this epoch
			// or the last passes uncharged and is charged for it when it
			// comes again (at creation, or on its bucket).
			state, first := m.seenMark(srcKeyBytes(sk), now, true)
			seen = state
			if (v4 && r.srcLen4 == 32) || (!v4 && r.srcLen6 == 64) {
				ss.touched = touchNo
				if first {
					ss.touched = touchFirst
				}
			}
			switch state {
			case seenNew:
				have = false
			case seenDeferred:
				if have {
					charge(&b, r.src, now, pi.Len)
				} else {
					b, have = charged(r.src, now, pi.Len), true
				}
			default:
				if !have {
					b, have = charged(r.src, now, pi.Len), true
				}
			}
		}
		if have {
			if !ss.counted {
				m.srcPkts[sk]++
			}
			ss.counted = true
			ok := take(&b, r.src, now, pi.Len)
			m.src[sk] = b
			m.traceSource(sk, before, existed, seen, true, ok, r.src)
			if !ok {
				return m.limited(v, maps.ReasonSrcLimit, &r, ss)
			}
		} else {
			m.traceSource(sk, before, existed, seen, false, true, r.src)
		}
	}
	if r.aggMode != maps.AggNone && r.aggLim && r.aggMode != maps.AggDerived {
		b := m.whole[r.id]
		ok := m.ovrTake(AggKey{RuleId: r.id, Kind: AggKindWhole}, &b, r.agg, r.reserve, maps.ClassAggPrefix, ss)
		m.whole[r.id] = b
		if !ok {
			return m.limited(v, maps.ReasonPrefixLimit, &r, ss)
		}
	}
	if r.aggMode == maps.AggDerived && r.aggLim {
		m.faultAgg(ak)
		b, have := m.agg[ak]
		if !have && gated(r.agg) {
			if state, _ := m.seenMark(aggKeyBytes(ak), now, false); state != seenNew {
				b, have = charged(r.agg, now, pi.Len), true
			}
		} else {
			have = true
		}
		if have {
			ok := m.ovrTake(ak, &b, r.agg, r.reserve, maps.ClassAggPrefix, ss)
			m.agg[ak] = b
			if !ok {
				return m.limited(v, maps.ReasonPrefixLimit, &r, ss)
			}
		} else {
			m.traceUncharged(ak, r.agg, r.reserve)
		}
	}
	if asn != 0 && r.asLim {
		m.faultAgg(nk)
		b := m.agg[nk]
		ok := m.ovrTake(nk, &b, r.asn, r.reserve, maps.ClassAggASN, ss)
		m.agg[nk] = b
		if !ok {
			return m.limited(v, maps.ReasonASNLimit, &r, ss)
		}
	}
	if g.globalLim && !m.ovrTake(AggKey{Kind: AggKindGlobal}, &m.global, g.global, g.reserve, maps.ClassAggGlobal, ss) {
		return m.limited(v, maps.ReasonGlobalLimit, &r, ss)
	}
	m.standingUpdate(ss, false)
	return v
}

// limited turns v into a drop, or a would-drop when the rule (or, if it
// inherits, the global setting) is dry-run.
func (m *Model) limited(v Verdict, reason maps.Reason, r *rule, ss *srcState) Verdict {
	v.Reason = reason
	if ss != nil && ss.refusedReason != 0 {
		// An override that refused names its writer.
		v.Reason = ss.refusedReason
	}
	v.Action = maps.ActDrop
	dry := m.gen.mode == maps.ModeDryRun
	if r.mode != maps.ModeInherit {
		dry = r.mode == maps.ModeDryRun
	}
	if dry {
		v.Action = maps.ActWouldDrop
	}
	if ss != nil {
		if ss.refusedOutcome != 0 {
			v.Refused, v.RefusedAgg = ss.refusedOutcome, ss.refusedAgg
		}
		if ss.refusedOutcome == maps.OutcomeRefusedReserve {
			d := 0
			if dry {
				d = 1
			}
			m.classes[d][ss.refusedAgg][ss.cls][maps.OutcomeRefusedReserve].Packets++
			m.classes[d][ss.refusedAgg][ss.cls][maps.OutcomeRefusedReserve].Bytes += uint64(ss.len)
		}
		if reason == maps.ReasonSrcLimit {
			m.standingUpdate(ss, true)
		}
	}
	return v
}

func (g *generation) l4Rule(pi Packet) (uint32, bool) {
	if pi.HasL4 {
		if id, ok := g.l4[l4Key{proto: pi.Proto, dir: maps.L4Src, port: pi.SrcPort}]; ok {
			return id, true
		}
		if id, ok := g.l4[l4Key{proto: pi.Proto, dir: maps.L4Dst, port: pi.DstPort}]; ok {
			return id, true
		}
	}
	id, ok := g.l4[l4Key{proto: pi.Proto, dir: maps.L4Any}]
	return id, ok
}

// RuleIDs returns the ids of the live generation's rules, sorted.
func (m *Model) RuleIDs() []uint32 {
	if m.gen == nil {
		return nil
	}
	ids := make([]uint32, 0, len(m.gen.rules))
	for id := range m.gen.rules {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Counters returns the global counters by action and reason.
func (m *Model) Counters() maps.Counters { return m.counters }

// RuleCounters returns the counters of every rule that counted a packet.
func (m *Model) RuleCounters() map[uint32]maps.RuleCounters {
	out := make(map[uint32]maps.RuleCounters, len(m.rules))
	for id, c := range m.rules {
		out[id] = c
	}
	return out
}

// SrcBuckets returns the per-source bucket table.
func (m *Model) SrcBuckets() map[SrcKey]Bucket {
	out := make(map[SrcKey]Bucket, len(m.src))
	for k, b := range m.src {
		out[k] = b
	}
	return out
}

// AggBuckets returns the derived-prefix and ASN aggregate bucket table.
func (m *Model) AggBuckets() map[AggKey]Bucket {
	out := make(map[AggKey]Bucket, len(m.agg))
	for k, b := range m.agg {
		out[k] = b
	}
	return out
}

// WholeBuckets returns the whole aggregates' buckets by rule id: those
// of the live rules that charged one since they (last) arrived. The
// program keeps them by the rule's slot; absent ones are zero there.
func (m *Model) WholeBuckets() map[uint32]Bucket {
	out := make(map[uint32]Bucket, len(m.whole))
	for id, b := range m.whole {
		out[id] = b
	}
	return out
}

// GlobalBucket returns the global bucket's state.
func (m *Model) GlobalBucket() Bucket { return m.global }
