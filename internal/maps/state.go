package maps

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// State is what the XDP program's decision reads, as read from its maps,
// in the maps' own types (bpf2go): refmodel.FromState loads it into the
// reference model, which is how `edgectl explain` decides a packet. Each
// field is read by one function below, one per map; a field added to a C
// struct arrives here with no change. Rule slots are as the program keeps
// them (facts, L4 entries, whole buckets and gate words are by slot; keys
// of buckets, overrides and standing name rule ids).
//
// The maps are read one after another while the program runs: a packet
// that lands between two reads is in some and not in others (explain's
// answer is for a state at most the read's duration old).
type State struct {
	// NowNS is the program's clock when the read began: the test clock
	// for a program loaded with one, else CLOCK_MONOTONIC.
	NowNS    uint64
	MaxRules uint32
	// SeenWords is the new-source filter's size (a power of two).
	SeenWords uint32
	Gen       uint32 // the live generation
	Config    loader.LimiterEgConfig
	StandingC loader.LimiterEgStandingCfg
	// Rules are the live generation's valid rules by slot.
	Rules map[uint32]loader.LimiterEgRule
	// L4 are the live generation's L4 entries (values: rule slots).
	L4 map[loader.LimiterEgL4Key]uint32
	// Facts is the live generation's prefix trie (rule slots).
	Facts     map[loader.LimiterEgLpmKey]loader.LimiterEgPrefixVal
	Lists     map[loader.LimiterEgLpmKey]loader.LimiterEgListVal
	KnownGood []loader.LimiterEgLpmKey
	// Whole are the whole aggregates' buckets by slot (zero ones left out).
	Whole     map[uint32]loader.LimiterEgBucket
	Global    loader.LimiterEgBucket
	Overrides map[loader.LimiterEgAggKey]loader.LimiterEgOverride
	// Gate is agg_gate by slot (zero words left out).
	Gate         map[uint32]uint32
	FpMasks      loader.LimiterEgFpMasks
	Fingerprints map[loader.LimiterEgFpKey]loader.LimiterEgFpVal

	// The large tables (per-source and aggregate buckets, the new-source
	// filter, standing) are not read whole: a decision touches a few
	// entries of them, looked up when the model first needs each (Src,
	// Agg, SeenWord, StandingOf), so explain costs the same with a full
	// table under a flood as with an empty one.
	m *Maps
}

// Src looks a per-source bucket up.
func (s *State) Src(k loader.LimiterEgSrcKey) (loader.LimiterEgSrcBucket, bool, error) {
	var v loader.LimiterEgSrcBucket
	err := s.m.o.SrcBuckets.Lookup(k, &v)
	return v, err == nil, notExistIsNil(err)
}

// Agg looks a derived-prefix or ASN aggregate's bucket up.
func (s *State) Agg(k loader.LimiterEgAggKey) (loader.LimiterEgBucket, bool, error) {
	var v loader.LimiterEgBucket
	err := s.m.o.AggBuckets.Lookup(k, &v)
	return v, err == nil, notExistIsNil(err)
}

// SeenWord reads word idx of the new-source filter.
func (s *State) SeenWord(idx uint32) (uint64, error) {
	var w uint64
	return w, s.m.o.SeenFilter.Lookup(idx, &w)
}

// StandingOf looks a source's standing entry up.
func (s *State) StandingOf(k loader.LimiterEgStandingKey) (loader.LimiterEgStandingVal, bool, error) {
	var v loader.LimiterEgStandingVal
	err := s.m.o.Standing.Lookup(k, &v)
	return v, err == nil, notExistIsNil(err)
}

func notExistIsNil(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// ReadState reads the program's decision state (see State).
func (m *Maps) ReadState() (*State, error) {
	s := &State{MaxRules: m.d.Sizes.MaxRules, SeenWords: m.o.SeenFilter.MaxEntries(), m: m}
	for _, read := range []func(*State) error{
		m.readClock, m.readGeneration, m.readRules, m.readL4, m.readFacts, m.readLists, m.readKnownGood,
		m.readWholeBuckets, m.readGlobalBucket, m.readOverrides, m.readGateWords, m.readFingerprints,
	} {
		if err := read(s); err != nil {
			return nil, fmt.Errorf("read data plane state: %w", err)
		}
	}
	return s, nil
}

func (m *Maps) readClock(s *State) error {
	if m.d.TestClock() {
		return m.o.TestClock.Lookup(uint32(0), &s.NowNS)
	}
	var err error
	s.NowNS, err = MonoNow()
	return err
}

func (m *Maps) readGeneration(s *State) error {
	var err error
	if s.Gen, err = m.activeGen(); err != nil {
		return err
	}
	if err := m.o.Configs.Lookup(s.Gen, &s.Config); err != nil {
		return fmt.Errorf("settings of generation %d: %w", s.Gen, err)
	}
	if err := m.o.StandingCfg.Lookup(s.Gen, &s.StandingC); err != nil {
		return fmt.Errorf("standing settings of generation %d: %w", s.Gen, err)
	}
	return nil
}

func (m *Maps) readRules(s *State) error {
	all, err := readArray[loader.LimiterEgRule](m.o.Rules)
	if err != nil {
		return fmt.Errorf("rules: %w", err)
	}
	s.Rules = map[uint32]loader.LimiterEgRule{}
	for i, r := range all {
		if uint32(i)/s.MaxRules == s.Gen && r.Valid != 0 {
			s.Rules[uint32(i)%s.MaxRules] = r
		}
	}
	return nil
}

func (m *Maps) readL4(s *State) error {
	all, err := readHash[loader.LimiterEgL4Key, uint32](m.o.L4Rules)
	if err != nil {
		return fmt.Errorf("l4 rules: %w", err)
	}
	s.L4 = map[loader.LimiterEgL4Key]uint32{}
	for k, v := range all {
		if uint32(k.Gen) == s.Gen {
			s.L4[k] = v
		}
	}
	return nil
}

func (m *Maps) readFacts(s *State) error {
	var id uint32
	if err := m.o.PrefixGens.Lookup(s.Gen, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			s.Facts = map[loader.LimiterEgLpmKey]loader.LimiterEgPrefixVal{}
			return nil
		}
		return fmt.Errorf("prefix trie of generation %d: %w", s.Gen, err)
	}
	trie, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return fmt.Errorf("open prefix trie of generation %d: %w", s.Gen, err)
	}
	defer trie.Close()
	s.Facts, err = readHash[loader.LimiterEgLpmKey, loader.LimiterEgPrefixVal](trie)
	if err != nil {
		return fmt.Errorf("prefix facts: %w", err)
	}
	return nil
}

func (m *Maps) readLists(s *State) (err error) {
	s.Lists, err = readHash[loader.LimiterEgLpmKey, loader.LimiterEgListVal](m.o.Lists)
	return wrapRead("lists", err)
}

func (m *Maps) readKnownGood(s *State) error {
	all, err := readHash[loader.LimiterEgLpmKey, uint32](m.o.KnownGood)
	for k := range all {
		s.KnownGood = append(s.KnownGood, k)
	}
	return wrapRead("known_good", err)
}

func (m *Maps) readWholeBuckets(s *State) error {
	all, err := readArray[loader.LimiterEgBucket](m.o.WholeBuckets)
	s.Whole = nonZero(all)
	return wrapRead("whole aggregates", err)
}

func (m *Maps) readGlobalBucket(s *State) error {
	slot := uint32(loader.LimiterEgGlobalSlotEG_GLOBAL_BUCKET)
	return wrapRead("global bucket", m.o.GlobalBuckets.Lookup(slot, &s.Global))
}

func (m *Maps) readOverrides(s *State) (err error) {
	s.Overrides, err = readHash[loader.LimiterEgAggKey, loader.LimiterEgOverride](m.o.Overrides)
	return wrapRead("overrides", err)
}

func (m *Maps) readGateWords(s *State) error {
	all, err := readArray[uint32](m.o.AggGate)
	s.Gate = nonZero(all)
	return wrapRead("override gate", err)
}

func (m *Maps) readFingerprints(s *State) error {
	if err := m.o.FpMasks.Lookup(uint32(0), &s.FpMasks); err != nil {
		return fmt.Errorf("fingerprint masks: %w", err)
	}
	var err error
	s.Fingerprints, err = readHash[loader.LimiterEgFpKey, loader.LimiterEgFpVal](m.o.FpRules)
	return wrapRead("fingerprints", err)
}

func wrapRead(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// readHash reads every entry of a hash, LRU or trie map: in batches
// where the kernel has them for the map type (not for tries), else one
// entry at a time.
func readHash[K comparable, V any](mp *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	if mp.Type() != ebpf.LPMTrie {
		const batch = 256
		keys, vals := make([]K, batch), make([]V, batch)
		var cursor ebpf.MapBatchCursor
		for {
			got, err := mp.BatchLookup(&cursor, keys, vals, nil)
			for i := range got {
				out[keys[i]] = vals[i]
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return out, nil
			}
			if err != nil {
				return nil, err
			}
		}
	}
	var k K
	var v V
	it := mp.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return out, it.Err()
}

// readArray reads a whole array map, in batches.
func readArray[V any](mp *ebpf.Map) ([]V, error) {
	n := int(mp.MaxEntries())
	out := make([]V, n)
	const batch = 4096
	var cursor ebpf.MapBatchCursor
	for done := 0; done < n; {
		c := min(batch, n-done)
		got, err := mp.BatchLookup(&cursor, make([]uint32, c), out[done:done+c], nil)
		done += got
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}

func nonZero[V comparable](all []V) map[uint32]V {
	var zero V
	out := map[uint32]V{}
	for i, v := range all {
		if v != zero {
			out[uint32(i)] = v
		}
	}
	return out
}

// WallTime is the wall-clock time of a data-plane time ns (CLOCK_MONOTONIC,
// or the test clock) in s's clock: the read's wall time plus the distance.
// Forever and 0 (never, not set) give nil.
func (s *State) WallTime(ns uint64, wall time.Time) *time.Time {
	if ns == 0 || ns == Forever {
		return nil
	}
	t := monoOffset{wall: wall, mono: s.NowNS}.toWall(ns)
	return &t
}

// FingerprintOf is the fingerprint an fp_rules entry holds, its expiry
// placed by WallTime.
func (s *State) FingerprintOf(k loader.LimiterEgFpKey, v loader.LimiterEgFpVal, wall time.Time) Fingerprint {
	return fingerprintFrom(k, v, monoOffset{wall: wall, mono: s.NowNS})
}

// OriginName names who wrote a list entry, override part or fingerprint.
func OriginName(o Origin) string {
	switch o {
	case OriginPolicy:
		return "policy"
	case OriginCLI:
		return "cli"
	case OriginL7:
		return "l7"
	case OriginShield:
		return "shield"
	case OriginFleet:
		return "fleet"
	}
	return fmt.Sprintf("origin %d", uint32(o))
}

// Match describes a fingerprint's fields as the shield writes them
// ("udp dport 9000 len 228").
func (f Fingerprint) Match() string {
	var parts []string
	if f.Mask&FieldProto != 0 {
		parts = append(parts, protoWord(f.Proto))
	}
	if f.Mask&FieldSrc != 0 {
		parts = append(parts, "src "+f.Src.String())
	}
	if f.Mask&FieldSPort != 0 {
		parts = append(parts, fmt.Sprintf("sport %d", f.SPort))
	}
	if f.Mask&FieldDPort != 0 {
		parts = append(parts, fmt.Sprintf("dport %d", f.DPort))
	}
	if f.Mask&FieldLen != 0 {
		parts = append(parts, fmt.Sprintf("len %d", f.Len))
	}
	if f.Mask&FieldTTL != 0 {
		parts = append(parts, fmt.Sprintf("ttl %d", f.TTL))
	}
	if f.Mask&FieldTCPFlags != 0 {
		parts = append(parts, fmt.Sprintf("tcp flags %#02x", f.TCPFlags))
	}
	return strings.Join(parts, " ")
}

func protoWord(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	}
	return fmt.Sprintf("proto %d", p)
}
