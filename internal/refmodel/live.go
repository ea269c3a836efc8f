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
		loadLists, loadKnownGood, loadBuckets, loadSeen, loadStanding, loadOverrides, loadFingerprints,
	} {
		load(m, s, ids)
	}
	return m, nil
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
		facts[prefixKey{addr: k.Addr, bits: int(k.Prefixlen)}] = fact{ruleID: idOf(v.RuleId), asn: v.Asn, prefix: maps.PrefixFromKey(k)}
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

// loadBuckets loads the bucket tables; whole aggregates are by slot in
// the program, by rule id in the model.
func loadBuckets(m *Model, s *maps.State, ids map[uint32]uint32) {
	for k, v := range s.Src {
		m.src[k] = v.B
		m.srcPkts[k] = v.Pkts
	}
	for k, v := range s.Agg {
		m.agg[k] = v
	}
	for slot, b := range s.Whole {
		if id, ok := ids[slot]; ok {
			m.whole[id] = b
		}
	}
	m.global = s.Global
}

func loadSeen(m *Model, s *maps.State, _ map[uint32]uint32) {
	for i, w := range s.Seen {
		m.seen[i] = w
	}
}

func loadStanding(m *Model, s *maps.State, _ map[uint32]uint32) {
	for k, v := range s.Standing {
		m.standing[k] = v
	}
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
