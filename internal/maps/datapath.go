package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Maps is a typed view of a loaded datapath's maps: one store per
// responsibility, each owning its maps and the byte layouts of their
// entries. Stores are safe for concurrent readers; see each for writers.
type Maps struct {
	*core

	// Generations writes a policy into the inactive generation and makes
	// it live (Stage, Commit, Revert): rules, settings, L4 entries,
	// prefix facts, the IPv4 direct table, standing and sampling
	// settings, known_good.
	Generations *Generations
	// Lists are the deny and allow lists.
	Lists *ListStore
	// Overrides are the aggregate overrides, the watched aggregates and
	// their gate and counters.
	Overrides *OverrideStore
	// Fingerprints are the fingerprint rules and their prefilter.
	Fingerprints *FingerprintStore
	// Standing is the per-source standing table and its counters.
	Standing *StandingStore
	// Samples are the drop and 1-in-N sample ring buffers and the
	// sampler's counters.
	Samples *SampleStore
	// Counters are the verdict counters by interface and rule, and the
	// tables' fill.
	Counters *CounterStore
}

// core is what every store reads: the datapath and its maps, the active
// generation, the live rules and the data plane's clock.
type core struct {
	d *loader.Datapath
	o *loader.LimiterMaps
}

// Generations owns the generation swap (Stage, Commit, Revert) and the
// tables written per generation.
type Generations struct {
	*core
	standing  *StandingStore // known_good, written by Stage
	overrides *OverrideStore // pruned for removed rules by Commit

	v4DirectMin int            // see SetV4DirectMinFacts
	v4Status    V4DirectStatus // of the generation the last Commit made live
}

// ListStore owns the lists trie.
type ListStore struct{ *core }

// OverrideStore owns overrides, agg_watches, agg_gate and agg_stats.
type OverrideStore struct {
	*core
	ovr overrideLock // writers of overrides, watches and their gate (overrides.go)
}

// FingerprintStore owns fp_rules, fp_masks, fp_stats and fp_pre_words.
type FingerprintStore struct {
	*core
	mu sync.Mutex // serialises this process's writers of the fingerprint tables
}

// StandingStore owns standing, known_good, class_stats and standing_stats.
type StandingStore struct{ *core }

// SampleStore owns the sample ring buffers and the sampler's counters.
type SampleStore struct{ *core }

// CounterStore owns stats and rule_stats, and counts the tables' fill.
type CounterStore struct{ *core }

// New wraps a loaded datapath.
func New(d *loader.Datapath) *Maps {
	c := &core{d: d, o: &d.Objects.LimiterMaps}
	standing := &StandingStore{c}
	overrides := &OverrideStore{core: c}
	return &Maps{
		core:         c,
		Generations:  &Generations{core: c, standing: standing, overrides: overrides, v4DirectMin: DefaultV4DirectMinFacts},
		Lists:        &ListStore{c},
		Overrides:    overrides,
		Fingerprints: &FingerprintStore{core: c},
		Standing:     standing,
		Samples:      &SampleStore{c},
		Counters:     &CounterStore{c},
	}
}

// Addr16 returns the data plane's 16-byte form of an address: IPv4 as
// IPv4-mapped IPv6.
func Addr16(a netip.Addr) [16]byte {
	return a.Unmap().As16()
}

// LPMKey returns the trie key of a prefix; IPv4 lengths move up by 96.
func LPMKey(p netip.Prefix) loader.LimiterEgLpmKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return loader.LimiterEgLpmKey{Prefixlen: uint32(bits), Addr: Addr16(p.Addr())}
}

// PrefixFromKey is the inverse of LPMKey.
func PrefixFromKey(k loader.LimiterEgLpmKey) netip.Prefix {
	a := netip.AddrFrom16(k.Addr)
	bits := int(k.Prefixlen)
	if a.Is4In6() && bits >= 96 {
		return netip.PrefixFrom(a.Unmap(), bits-96)
	}
	return netip.PrefixFrom(a, bits)
}

// Active returns the generation the program is using.
func (m *Generations) Active() (uint32, error) { return m.activeGen() }

func (m *core) activeGen() (uint32, error) {
	var a loader.LimiterEgActive
	if err := m.o.Active.Lookup(uint32(0), &a); err != nil {
		return 0, fmt.Errorf("read active generation: %w", err)
	}
	return a.Gen & 1, nil
}

// The policy's enums, as the data plane's (bpf2go, bpf/headers).

func globalMode(m policy.Mode) (Mode, error) {
	switch m {
	case policy.ModeEnforce:
		return ModeEnforce, nil
	case policy.ModeDryRun:
		return ModeDryRun, nil
	}
	return 0, fmt.Errorf("global mode must be enforce or dry-run, not %q", m)
}

func ruleMode(m policy.RuleMode) (Mode, error) {
	switch m {
	case policy.RuleModeInherit, "":
		return ModeInherit, nil
	case policy.RuleModeEnforce:
		return ModeEnforce, nil
	case policy.RuleModeDryRun:
		return ModeDryRun, nil
	}
	return 0, fmt.Errorf("rule mode must be inherit, enforce or dry-run, not %q", m)
}

func ruleAction(a policy.Action) (RuleAction, error) {
	switch a {
	case policy.ActionLimit, "":
		return RuleLimit, nil
	case policy.ActionDrop:
		return RuleDrop, nil
	case policy.ActionPass:
		return RulePass, nil
	}
	return 0, fmt.Errorf("rule action must be limit, drop or pass, not %q", a)
}

func aggMode(m policy.AggregateMode) (AggMode, error) {
	switch m {
	case policy.AggregateNone:
		return AggNone, nil
	case policy.AggregateWhole:
		return AggWhole, nil
	case policy.AggregateDerived:
		return AggDerived, nil
	}
	return 0, fmt.Errorf("aggregate mode %d unknown", m)
}

func malformedVerdict(v policy.Verdict) (Action, error) {
	switch v {
	case policy.VerdictPass, "":
		return ActPass, nil
	case policy.VerdictDrop:
		return ActDrop, nil
	}
	return 0, fmt.Errorf("malformed verdict must be pass or drop, not %q", v)
}

func clockOf(c policy.Clock) (Clock, error) {
	switch c {
	case policy.ClockPrecise, "":
		return ClockPrecise, nil
	case policy.ClockCoarse:
		return ClockCoarse, nil
	}
	return 0, fmt.Errorf("clock must be coarse or precise, not %q", c)
}

// L4DirOf is the data plane's direction of an L4 entry.
func L4DirOf(d policy.PortDir) (L4Dir, error) {
	switch d {
	case policy.PortAny:
		return L4Any, nil
	case policy.PortSrc:
		return L4Src, nil
	case policy.PortDst:
		return L4Dst, nil
	}
	return 0, fmt.Errorf("l4 port direction %d unknown", d)
}

// RuleConfig is a compiled rule as the data plane's rules table holds it
// (Valid set; the reference model reads the same).
func RuleConfig(r policy.CompiledRule) (loader.LimiterEgRule, error) {
	out := loader.LimiterEgRule{
		Id: r.ID, SrcLen4: r.SourceKey.V4, SrcLen6: r.SourceKey.V6,
		AggLen4: r.AggregateKey.V4, AggLen6: r.AggregateKey.V6, Valid: 1,
	}
	mode, err := ruleMode(r.Mode)
	if err != nil {
		return out, fmt.Errorf("rule %d: %w", r.ID, err)
	}
	action, err := ruleAction(r.Action)
	if err != nil {
		return out, fmt.Errorf("rule %d: %w", r.ID, err)
	}
	agg, err := aggMode(r.Aggregate)
	if err != nil {
		return out, fmt.Errorf("rule %d: %w", r.ID, err)
	}
	out.Mode, out.Action, out.AggMode = uint8(mode), uint8(action), uint8(agg)
	if out.Src, err = BucketConfig(r.PerSource); err != nil {
		return out, fmt.Errorf("rule %d per-source: %w", r.ID, err)
	}
	if out.Agg, err = BucketConfig(r.PerPrefix); err != nil {
		return out, fmt.Errorf("rule %d prefix aggregate: %w", r.ID, err)
	}
	if out.Asn, err = BucketConfig(r.PerASN); err != nil {
		return out, fmt.Errorf("rule %d asn aggregate: %w", r.ID, err)
	}
	if out.Reserve, err = Reserve16(r.Reserve); err != nil {
		return out, fmt.Errorf("rule %d: %w", r.ID, err)
	}
	if r.SourceKey.V4 > 32 || r.AggregateKey.V4 > 32 || r.SourceKey.V6 > 128 || r.AggregateKey.V6 > 128 {
		return out, fmt.Errorf("rule %d: key length out of range", r.ID)
	}
	return out, nil
}

// SettingsConfig is a generation's global settings as the data plane's
// config table holds them, for a generation whose L4 entries match the
// protocols in l4protos (L4Bit); V4Direct is left to Stage.
func SettingsConfig(c *policy.Compiled, l4protos uint8) (loader.LimiterEgConfig, error) {
	out := loader.LimiterEgConfig{L4Protos: l4protos, Valid: 1}
	mode, err := globalMode(c.Mode)
	if err != nil {
		return out, err
	}
	malformed, err := malformedVerdict(c.Malformed)
	if err != nil {
		return out, err
	}
	clock, err := clockOf(c.Clock)
	if err != nil {
		return out, err
	}
	out.Mode, out.MalformedVerdict, out.Clock = uint8(mode), uint8(malformed), uint8(clock)
	if out.Global, err = BucketConfig(c.Global); err != nil {
		return out, fmt.Errorf("global bucket: %w", err)
	}
	if out.Reserve, err = Reserve16(c.GlobalReserve); err != nil {
		return out, fmt.Errorf("global: %w", err)
	}
	if c.Samples.IsSet() {
		if out.Sample, err = BucketConfig(policy.Bucket{Packets: c.Samples}); err != nil {
			return out, fmt.Errorf("sample budget: %w", err)
		}
	}
	return out, nil
}

// Reserve16 turns a reserve in parts per million into the data plane's
// 1/65536 of the burst tolerance, rounded to nearest (within 0.0008% of the
// tolerance).
func Reserve16(ppm uint32) (uint16, error) {
	if ppm >= 1_000_000 {
		return 0, fmt.Errorf("reserve %d ppm: must be below 100%%", ppm)
	}
	r := (uint64(ppm)*65536 + 500_000) / 1_000_000
	return uint16(min(r, 65535)), nil
}

// L4Bit is the bit of eg_config.l4_protos for an IP protocol (EG_L4P_*,
// through bpf2go: enum eg_l4_proto_bit), 0 for a protocol L4 rules cannot
// match.
func L4Bit(proto uint8) uint8 {
	switch proto {
	case 6:
		return uint8(loader.LimiterEgL4ProtoBitEG_L4BIT_TCP)
	case 17:
		return uint8(loader.LimiterEgL4ProtoBitEG_L4BIT_UDP)
	case 1:
		return uint8(loader.LimiterEgL4ProtoBitEG_L4BIT_ICMP)
	case 58:
		return uint8(loader.LimiterEgL4ProtoBitEG_L4BIT_ICMPV6)
	}
	return 0
}

// noSlot is where prefix facts naming an unknown rule point: past the end
// of the rules table, so the data plane passes such packets as no_policy.
const noSlot = ^uint32(0)

// Stage writes c into the inactive generation: its rules, settings, L4
// entries, prefix trie, IPv4 direct table and standing settings; Commit
// then makes it live in one map write, so packets see either the old
// generation or the new one. Nothing a packet sees changes before Commit,
// except the known_good table (facts about sources, not per generation)
// and the counters and whole-aggregate buckets of rule slots that change
// hands, which start over. On error the live policy is unchanged. IPv4
// sources use the direct table when the policy has enough IPv4 facts and
// the table fits its budget, else the trie; a table that does not fit is
// logged as a warning (see V4Direct).
//
// Stage, Commit and Revert must not run concurrently with each other (the
// daemon serialises policy changes); readers may run at any time. Stage
// is the slow part (a large policy writes many entries), so a caller can
// hold its own lock for Commit only.
//
// Rule ids are arbitrary 32-bit values (the policy hashes rule names); the
// data plane keys bucket state by id, so a rule whose id survives keeps its
// state. Rules live in table slots: Stage keeps each surviving id in its
// slot (so its counters and its whole-aggregate bucket, which the data plane
// keeps by slot, continue), puts id 0, the default rule, in slot 0, prefers
// slot == id for small ids, and clears the counters and the whole-aggregate
// bucket of a slot that changes hands.
func (m *Generations) Stage(c *policy.Compiled) (*Staged, error) {
	cur, err := m.activeGen()
	if err != nil {
		return nil, err
	}
	next := cur ^ 1
	maxRules := m.d.Sizes.MaxRules

	old, err := m.readSlots(cur)
	if err != nil {
		return nil, err
	}
	slots, fresh, err := assignSlots(c.Rules, old, maxRules)
	if err != nil {
		return nil, err
	}

	// Rules: the whole half of the next generation is rewritten, so ids
	// that disappeared become invalid.
	keys := make([]uint32, maxRules)
	vals := make([]loader.LimiterEgRule, maxRules)
	for i := range keys {
		keys[i] = next*maxRules + uint32(i)
	}
	for _, r := range c.Rules {
		if vals[slots[r.ID]], err = RuleConfig(r); err != nil {
			return nil, err
		}
	}

	var protos uint8
	l4 := make([]l4Entry, len(c.L4))
	for i, l := range c.L4 {
		slot, ok := slots[l.RuleID]
		if !ok {
			return nil, fmt.Errorf("l4 match proto %d port %d names unknown rule %d", l.Protocol, l.Port, l.RuleID)
		}
		if L4Bit(l.Protocol) == 0 {
			return nil, fmt.Errorf("l4 match: protocol %d is not tcp, udp, icmp or icmpv6", l.Protocol)
		}
		dir, err := L4DirOf(l.Dir)
		if err != nil {
			return nil, err
		}
		protos |= L4Bit(l.Protocol)
		l4[i] = l4Entry{proto: l.Protocol, dir: dir, port: l.Port, slot: slot}
	}
	facts := make([]slotFact, len(c.Prefixes))
	for i, f := range c.Prefixes {
		facts[i] = slotFact{Prefix: f.Prefix, Slot: noSlot, ASN: f.ASN, Country: f.Country}
		if slot, ok := slots[f.RuleID]; ok {
			facts[i].Slot = slot
		}
	}
	cfg, err := SettingsConfig(c, protos)
	if err != nil {
		return nil, err
	}
	// Rules, L4 matches and settings are checked; the tables below check
	// their own capacity as they are written.
	if err := batchUpdate(m.o.Rules, keys, vals); err != nil {
		return nil, fmt.Errorf("write rules of generation %d: %w", next, err)
	}
	if err := m.replaceL4(uint8(next), l4); err != nil {
		return nil, err
	}

	trie, err := m.d.NewPrefixTrie()
	if err != nil {
		return nil, err
	}
	defer trie.Close()
	if err := fillPrefixTrie(trie, facts); err != nil {
		return nil, err
	}
	if err := m.o.PrefixGens.Put(next, trie); err != nil {
		return nil, fmt.Errorf("install prefix trie of generation %d: %w", next, err)
	}
	direct, err := m.writeV4Direct(next, facts)
	if err != nil {
		return nil, err
	}
	if direct.Used {
		cfg.V4Direct = 1
	}
	if err := m.o.StandingCfg.Put(next, StandingConfig(c.Standing)); err != nil {
		return nil, fmt.Errorf("write standing settings of generation %d: %w", next, err)
	}
	sampling, err := SamplingConfig(c.Sampling)
	if err != nil {
		return nil, err
	}
	if err := m.o.SampleCfgs.Put(next, sampling); err != nil {
		return nil, fmt.Errorf("write sampling settings of generation %d: %w", next, err)
	}
	// Not per generation: known-good prefixes are facts about sources, and
	// an entry one generation early or late changes one source's class.
	if err := m.standing.setKnownGood(c.Standing.KnownGood); err != nil {
		return nil, err
	}
	if err := m.o.Configs.Put(next, cfg); err != nil {
		return nil, fmt.Errorf("write settings of generation %d: %w", next, err)
	}
	// Slots that change hands start over: counters and whole aggregate.
	// Last before the flip, so a failed Stage leaves the live rules' state
	// alone.
	for _, slot := range fresh {
		if err := m.clearRuleCounters(slot); err != nil {
			return nil, err
		}
		if err := m.clearWholeBucket(slot); err != nil {
			return nil, err
		}
	}
	return &Staged{gen: next, direct: direct, prev: m.v4Status}, nil
}

// Staged is a generation Stage wrote, ready for Commit.
type Staged struct {
	gen          uint32
	direct, prev V4DirectStatus
}

// Commit makes a staged generation live: one write of the active index,
// after which every packet sees it. It fails, changing nothing, when a
// generation went live since Stage (the staged half may be stale).
func (m *Generations) Commit(s *Staged) error {
	cur, err := m.activeGen()
	if err != nil {
		return err
	}
	if cur != s.gen^1 {
		return fmt.Errorf("commit generation %d: generation %d went live after it was staged", s.gen, cur)
	}
	if err := m.o.Active.Put(uint32(0), loader.LimiterEgActive{Gen: s.gen}); err != nil {
		return fmt.Errorf("activate generation %d: %w", s.gen, err)
	}
	m.v4Status = s.direct
	logV4Direct(m.d.Logger(), s.gen, s.direct)
	// Overrides of rules that are gone go with them; the others keep
	// their rule's slot. Not an error of the apply: the policy is live.
	if err := m.overrides.pruneOverridesFor(); err != nil {
		m.d.Logger().Warn("overrides of removed rules not all pruned", "err", err)
	}
	return nil
}

// Revert makes the generation that was live before Commit(s) live again,
// as it was (Stage wrote only the other half), when nothing was staged
// since. Counters and whole-aggregate buckets of slots that changed hands
// stay cleared, and known_good keeps what Stage wrote.
func (m *Generations) Revert(s *Staged) error {
	if err := m.o.Active.Put(uint32(0), loader.LimiterEgActive{Gen: s.gen ^ 1}); err != nil {
		return fmt.Errorf("reactivate generation %d: %w", s.gen^1, err)
	}
	m.v4Status = s.prev
	return nil
}

// l4Entry is an L4 table entry with its rule's slot.
type l4Entry struct {
	proto uint8
	dir   L4Dir
	port  uint16
	slot  uint32
}

// readSlots returns rule id -> slot of a generation's valid rules, reading
// the rules table in one batch lookup.
func (m *core) readSlots(gen uint32) (map[uint32]uint32, error) {
	maxRules := m.d.Sizes.MaxRules
	n := int(m.o.Rules.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]loader.LimiterEgRule, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.o.Rules.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("read rules of generation %d: %w", gen, err)
	}
	out := map[uint32]uint32{}
	for i := 0; i < got; i++ {
		if keys[i]/maxRules == gen && vals[i].Valid != 0 {
			out[vals[i].Id] = keys[i] % maxRules
		}
	}
	return out, nil
}

// assignSlots places rules in table slots (see Stage) and returns the slots
// that change hands.
func assignSlots(rules []policy.CompiledRule, old map[uint32]uint32, maxRules uint32) (map[uint32]uint32, []uint32, error) {
	if uint32(len(rules)) > maxRules {
		return nil, nil, fmt.Errorf("%d rules, the table holds %d: raise tables.max_rules", len(rules), maxRules)
	}
	slots := make(map[uint32]uint32, len(rules))
	taken := make(map[uint32]bool, len(rules))
	for _, r := range rules {
		if _, dup := slots[r.ID]; dup {
			return nil, nil, fmt.Errorf("rule id %d used twice", r.ID)
		}
		slots[r.ID] = noSlot
	}
	place := func(id, slot uint32) {
		slots[id] = slot
		taken[slot] = true
	}
	if _, ok := slots[0]; ok {
		place(0, 0)
	}
	taken[0] = true // slot 0 is the default rule's, present or not
	for _, r := range rules {
		if s, ok := old[r.ID]; ok && r.ID != 0 && !taken[s] {
			place(r.ID, s)
		}
	}
	var fresh []uint32
	for _, r := range rules {
		if slots[r.ID] != noSlot {
			continue
		}
		if r.ID < maxRules && !taken[r.ID] {
			place(r.ID, r.ID)
		}
	}
	next := uint32(1)
	for _, r := range rules {
		if slots[r.ID] == noSlot {
			for taken[next] {
				next++
			}
			place(r.ID, next)
		}
		if s, ok := old[r.ID]; !ok || s != slots[r.ID] {
			fresh = append(fresh, slots[r.ID])
		}
	}
	return slots, fresh, nil
}

// RuleSlots returns rule id -> table slot of the live generation.
func (m *Generations) RuleSlots() (map[uint32]uint32, error) { return m.ruleSlots() }

func (m *core) ruleSlots() (map[uint32]uint32, error) {
	gen, err := m.activeGen()
	if err != nil {
		return nil, err
	}
	return m.readSlots(gen)
}

// clearWholeBucket fills the whole-aggregate bucket of a slot that changes
// hands, so a new rule does not inherit the leaving rule's debt. Done
// before the flip, like the counters: until then the leaving rule may still
// charge it, by at most the packets of that window.
func (m *Generations) clearWholeBucket(slot uint32) error {
	if err := m.o.WholeBuckets.Put(slot, loader.LimiterEgBucket{}); err != nil {
		return fmt.Errorf("clear whole aggregate of rule slot %d: %w", slot, err)
	}
	return nil
}

func (m *Generations) clearRuleCounters(slot uint32) error {
	n, err := possibleCPUs()
	if err != nil {
		return err
	}
	if err := m.o.RuleStats.Put(slot, make([]loader.LimiterEgRuleCounters, n)); err != nil {
		return fmt.Errorf("clear counters of rule slot %d: %w", slot, err)
	}
	return nil
}

func (m *Generations) replaceL4(gen uint8, want []l4Entry) error {
	var k loader.LimiterEgL4Key
	var v uint32
	var stale []loader.LimiterEgL4Key
	it := m.o.L4Rules.Iterate()
	for it.Next(&k, &v) {
		if k.Gen == gen {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list l4 rules: %w", err)
	}
	for _, k := range stale {
		if err := m.o.L4Rules.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete stale l4 rule: %w", err)
		}
	}
	for _, l := range want {
		key := loader.LimiterEgL4Key{Gen: gen, Proto: l.proto, Dir: uint8(l.dir), Port: l.port}
		if l.dir == L4Any {
			key.Port = 0
		}
		if err := m.o.L4Rules.Put(key, l.slot); err != nil {
			return fmt.Errorf("write l4 rule proto %d port %d: %w", l.proto, l.port, err)
		}
	}
	return nil
}

// slotFact is a prefix fact as the data plane holds it: the rule's table
// slot (Stage's), not its id.
type slotFact struct {
	Prefix  netip.Prefix
	Slot    uint32
	ASN     uint32
	Country [2]byte
}

func fillPrefixTrie(trie *ebpf.Map, facts []slotFact) error {
	if len(facts) == 0 {
		return nil
	}
	if uint32(len(facts)) > trie.MaxEntries() {
		return fmt.Errorf("prefix trie holds %d entries, policy needs %d: raise tables.prefixes", trie.MaxEntries(), len(facts))
	}
	keys := make([]loader.LimiterEgLpmKey, len(facts))
	vals := make([]loader.LimiterEgPrefixVal, len(facts))
	for i, f := range facts {
		if !f.Prefix.IsValid() {
			return fmt.Errorf("invalid prefix in prefix facts")
		}
		keys[i] = LPMKey(f.Prefix)
		vals[i] = loader.LimiterEgPrefixVal{RuleSlot: f.Slot, Asn: f.ASN, Country: uint16(f.Country[0])<<8 | uint16(f.Country[1])}
	}
	if err := batchUpdate(trie, keys, vals); err != nil {
		return fmt.Errorf("fill prefix trie: %w", err)
	}
	return nil
}

// batchUpdate writes keys and values in one syscall where the kernel can,
// element by element where it cannot.
func batchUpdate[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := m.BatchUpdate(keys, vals, nil)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	for i := range keys {
		if err := m.Put(keys[i], vals[i]); err != nil {
			return err
		}
	}
	return nil
}

// SetTestClock sets the time a program loaded with TestClock sees, in ns.
func (m *Maps) SetTestClock(ns uint64) error {
	return m.o.TestClock.Put(uint32(0), ns)
}
