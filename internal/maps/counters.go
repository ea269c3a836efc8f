package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// Counter is a packet and byte count.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

// Counters are the data plane's totals, summed over CPUs, by action and
// reason.
type Counters [numActions][numReasons]Counter

// Total sums a counter over reasons.
func (c *Counters) Total(a Action) Counter {
	var t Counter
	for _, r := range c[a] {
		t.Packets += r.Packets
		t.Bytes += r.Bytes
	}
	return t
}

// Get returns one (action, reason) counter.
func (c *Counters) Get(a Action, r Reason) Counter { return c[a][r] }

// IfaceSlots is how many interface slots the counters have; slot 0 counts
// every interface without a slot of its own.
const IfaceSlots = int(loader.LimiterEgSizesEG_IFACE_SLOTS)

// Counters reads the counters summed over CPUs and interfaces.
func (m *CounterStore) Totals() (Counters, error) {
	slots, err := m.BySlot()
	if err != nil {
		return Counters{}, err
	}
	var out Counters
	for _, s := range slots {
		for a := range s {
			for r := range s[a] {
				out[a][r].Packets += s[a][r].Packets
				out[a][r].Bytes += s[a][r].Bytes
			}
		}
	}
	return out, nil
}

// CountersBySlot reads the counters of every interface slot, summed over
// CPUs, in one batch lookup.
func (m *CounterStore) BySlot() ([IfaceSlots]Counters, error) {
	var out [IfaceSlots]Counters
	ncpu, err := possibleCPUs()
	if err != nil {
		return out, err
	}
	n := IfaceSlots * numActions * numReasons
	keys := make([]uint32, n)
	vals := make([]loader.LimiterEgCounter, n*ncpu)
	var cursor ebpf.MapBatchCursor
	got, err := m.o.Stats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return out, fmt.Errorf("read counters: %w", err)
	}
	for i := 0; i < got; i++ {
		idx := int(keys[i])
		slot, rest := idx/(numActions*numReasons), idx%(numActions*numReasons)
		a, r := rest/numReasons, rest%numReasons
		if slot >= IfaceSlots {
			continue
		}
		for _, c := range vals[i*ncpu : (i+1)*ncpu] {
			out[slot][a][r].Packets += c.Packets
			out[slot][a][r].Bytes += c.Bytes
		}
	}
	return out, nil
}

// RuleCounters are one rule's counters by action.
type RuleCounters [numActions]Counter

// RuleCounters reads the counters of the given rule ids (rules of the live
// generation; other ids are left out).
func (m *CounterStore) Rules(ids []uint32) (map[uint32]RuleCounters, error) {
	slots, err := m.ruleSlots()
	if err != nil {
		return nil, err
	}
	ncpu, err := possibleCPUs()
	if err != nil {
		return nil, err
	}
	// One batch lookup of every slot, summed per CPU.
	n := int(m.o.RuleStats.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]loader.LimiterEgRuleCounters, n*ncpu)
	var cursor ebpf.MapBatchCursor
	got, err := m.o.RuleStats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("read rule counters: %w", err)
	}
	bySlot := make(map[uint32]int, got)
	for i := 0; i < got; i++ {
		bySlot[keys[i]] = i
	}
	out := make(map[uint32]RuleCounters, len(ids))
	for _, id := range ids {
		slot, ok := slots[id]
		if !ok {
			continue
		}
		i, ok := bySlot[slot]
		if !ok {
			continue
		}
		var rc RuleCounters
		for _, c := range vals[i*ncpu : (i+1)*ncpu] {
			for a := range rc {
				rc[a].Packets += c.ByAction[a].Packets
				rc[a].Bytes += c.ByAction[a].Bytes
			}
		}
		out[id] = rc
	}
	return out, nil
}

func possibleCPUs() (int, error) {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return 0, fmt.Errorf("count possible cpus: %w", err)
	}
	return n, nil
}

// Occupancy is how full a table is.
type Occupancy struct {
	Entries  int
	Capacity int
}

// Tables reports the fill of the stateful tables. Hash tables are counted
// with batch lookups (a few syscalls per 4,096 entries: ~40 ms for a full
// table of a million sources); the lists trie, which has no batch lookup and
// stays small, entry by entry. Call it at scrape time, not per packet.
func (m *CounterStore) Tables() (map[string]Occupancy, error) {
	out := map[string]Occupancy{}
	n, err := countBatch[loader.LimiterEgSrcKey, loader.LimiterEgSrcBucket](m.o.SrcBuckets)
	if err != nil {
		return nil, fmt.Errorf("count sources: %w", err)
	}
	out["sources"] = Occupancy{Entries: n, Capacity: int(m.o.SrcBuckets.MaxEntries())}
	if n, err = countBatch[loader.LimiterEgAggKey, loader.LimiterEgBucket](m.o.AggBuckets); err != nil {
		return nil, fmt.Errorf("count aggregates: %w", err)
	}
	out["aggregates"] = Occupancy{Entries: n, Capacity: int(m.o.AggBuckets.MaxEntries())}
	if n, err = countBatch[loader.LimiterEgStandingKey, loader.LimiterEgStandingVal](m.o.Standing); err != nil {
		return nil, fmt.Errorf("count standing: %w", err)
	}
	out["standing"] = Occupancy{Entries: n, Capacity: int(m.o.Standing.MaxEntries())}
	var k loader.LimiterEgLpmKey
	var v loader.LimiterEgListVal
	n = 0
	it := m.o.Lists.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("count lists: %w", err)
	}
	out["lists"] = Occupancy{Entries: n, Capacity: int(m.o.Lists.MaxEntries())}
	return out, nil
}

func countBatch[K, V any](m *ebpf.Map) (int, error) {
	const chunk = 4096
	keys := make([]K, chunk)
	vals := make([]V, chunk)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil
		}
	}
}
