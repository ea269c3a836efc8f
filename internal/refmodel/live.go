package refmodel

import (
	"fmt"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// FromState is the model of a running program: its maps as read by
// maps.Maps.ReadState, loaded one table at a time (a loader per table
// below; a field the decision reads is one line in ruleOf, settings or
// the loader of its table). Rule slots become rule ids here: the model
// keys rules by id, as the program's bucket, override and standing keys
// do. The model decides what the program would at s.NowNS; what it
// cannot know is in docs/operations.md ("What explain cannot see").
func FromState(s *maps.State) (*Model, error) {
	if s.SeenWords == 0 || s.SeenWords&(s.SeenWords-1) != 0 {
		return nil, fmt.Errorf("new-source filter of %d words: not a power of two", s.SeenWords)
	}
	m := New(s.MaxRules, 0)
	m.seenMask = s.SeenWords - 1
	ids := loadGeneration(m, s)
	for _, load := range []func(*Model, *maps.State, map[uint32]uint32){
		loadLists, loadKnownGood, loadBuckets, loadOverrides, loadFingerprints,
	} {
		load(m, s, ids)
	}
	m.live = &liveTables{s: s, tried: map[any]bool{}}
	return m, nil
}

// liveTables looks the large tables up entry by entry as the decision
// first needs each (maps.State); an entry looked up once is the model's
// from then on. The first lookup error is kept (LiveErr).
type liveTables struct {
	s     *maps.State
	tried map[any]bool
	err   error
}

// LiveErr is the first error looking up the program's tables (FromState
// models), nil if none: a decision that met one is not the program's.
func (m *Model) LiveErr() error {
	if m.live == nil {
		return nil
	}
	return m.live.err
}

func (l *liveTables) first(k any) bool {
	if l == nil || l.tried[k] {
		return false
	}
	l.tried[k] = true
	return true
}

func (l *liveTables) fail(err error) {
	if err != nil && l.err == nil {
		l.err = err
	}
}

// faultSrc brings a per-source bucket in (with its packet count).
func (m *Model) faultSrc(k SrcKey) {
	if _, ok := m.src[k]; ok || !m.live.first(k) {
		return
	}
	v, ok, err := m.live.s.Src(k)
	m.live.fail(err)
	if ok {
		m.src[k], m.srcPkts[k] = v.B, v.Pkts
	}
}

// faultAgg brings a derived-prefix or ASN aggregate's bucket in.
func (m *Model) faultAgg(k AggKey) {
	if _, ok := m.agg[k]; ok || !m.live.first(k) {
		return
	}
	v, ok, err := m.live.s.Agg(k)
	m.live.fail(err)
	if ok {
		m.agg[k] = v
	}
}

// faultSeen brings a word of the new-source filter in.
func (m *Model) faultSeen(idx uint32) {
	if _, ok := m.seen[idx]; ok || !m.live.first(idx) {
		return
	}
	w, err := m.live.s.SeenWord(idx)
	m.live.fail(err)
	if w != 0 {
		m.seen[idx] = w
	}
}

// faultStanding brings a source's standing entry in.
func (m *Model) faultStanding(k StandingKey) {
	if _, ok := m.standing[k]; ok || !m.live.first(k) {
		return
	}
	v, ok, err := m.live.s.StandingOf(k)
	m.live.fail(err)
	if ok {
		m.standing[k] = v
	}
}

// noRule is the id a slot without a valid rule is loaded as: no rule of
// the generation has it, so the model answers no_policy as the program
// does for such a slot.
func noRule(rules map[uint32]rule) uint32 {
	id := ^uint32(0)
	for {
		if _, used := rules[id]; !used {
			return id
		}
		id--
	}
}

// loadGeneration loads the live generation (rules by id, settings, L4
// entries, prefix facts) and returns rule slot -> id.
func loadGeneration(m *Model, s *maps.State) map[uint32]uint32 {
	g := &generation{rules: map[uint32]rule{}, l4: map[l4Key]uint32{}}
	ids := map[uint32]uint32{}
	for slot, v := range s.Rules {
		g.rules[v.Id] = ruleOf(v)
		ids[slot] = v.Id
	}
	idOf := func(slot uint32) uint32 {
		if id, ok := ids[slot]; ok {
			return id
		}
		return noRule(g.rules)
	}
	g.settings(s.Config, s.StandingC)
	g.defaultRule = idOf(0)
	for k, slot := range s.L4 {
		g.l4[l4Key{proto: k.Proto, dir: maps.L4Dir(k.Dir), port: k.Port}] = idOf(slot)
	}
	facts := map[prefixKey]fact{}
	for k, v := range s.Facts {
		facts[prefixKey{addr: k.Addr, bits: int(k.Prefixlen)}] = fact{ruleID: idOf(v.RuleSlot), asn: v.Asn, prefix: maps.PrefixFromKey(k)}
	}
	g.prefixes = newLPMTable(facts)
	if s.Config.Valid != 0 {
		m.gen = g
	}
	return ids
}

func loadLists(m *Model, s *maps.State, _ map[uint32]uint32) {
	t := map[prefixKey]maps.ListEntry{}
	for k, v := range s.Lists {
		t[prefixKey{addr: k.Addr, bits: int(k.Prefixlen)}] = maps.ListEntry{Prefix: maps.PrefixFromKey(k),
			DenyUntil: v.DenyUntil, AllowUntil: v.AllowUntil, Origin: maps.Origin(v.Origin)}
	}
	m.lists = newLPMTable(t)
}

func loadKnownGood(m *Model, s *maps.State, _ map[uint32]uint32) {
	t := map[prefixKey]bool{}
	for _, k := range s.KnownGood {
		t[prefixKey{addr: k.Addr, bits: int(k.Prefixlen)}] = true
	}
	m.knownGood = newLPMTable(t)
}

// loadBuckets loads the whole aggregates (by slot in the program, by
// rule id in the model) and the global bucket; per-source and derived
// aggregate buckets are looked up as needed (faultSrc, faultAgg).
func loadBuckets(m *Model, s *maps.State, ids map[uint32]uint32) {
	for slot, b := range s.Whole {
		if id, ok := ids[slot]; ok {
			m.whole[id] = b
		}
	}
	m.global = s.Global
}

// loadOverrides loads the overrides as they are (new-source buckets
// included) and the gate words, by rule id.
func loadOverrides(m *Model, s *maps.State, ids map[uint32]uint32) {
	m.ovr = map[AggKey]Override{}
	for k, v := range s.Overrides {
		m.ovr[k] = v
	}
	m.gate = map[uint32]uint32{}
	for slot, id := range ids {
		m.gate[id] = s.Gate[slot]
	}
}

func loadFingerprints(m *Model, s *maps.State, _ map[uint32]uint32) {
	m.fpInit()
	fm := s.FpMasks
	var masks []FpMask
	for i := range min(int(fm.N), len(fm.Fields)) {
		masks = append(masks, FpMask{Fields: fm.Fields[i], SrcLen: fm.SrcLen[i]})
	}
	m.SetFingerprintMasks(masks)
	for k, v := range s.Fingerprints {
		m.fp.rules[k] = v
		m.fp.stats[v.Id] = FpStats{}
	}
}
