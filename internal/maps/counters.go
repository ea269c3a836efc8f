package maps

import (
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
func (m *Maps) Counters() (Counters, error) {
	slots, err := m.CountersBySlot()
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
// CPUs, in one batch where the kernel can.
func (m *Maps) CountersBySlot() ([IfaceSlots]Counters, error) {
	var out [IfaceSlots]Counters
	var per []loader.LimiterEgCounter
	for slot := 0; slot < IfaceSlots; slot++ {
		for a := 0; a < numActions; a++ {
			for r := 0; r < numReasons; r++ {
				idx := uint32((slot*numActions+a)*numReasons + r)
				if err := m.o.Stats.Lookup(idx, &per); err != nil {
					return out, fmt.Errorf("read counters: %w", err)
				}
				for _, c := range per {
					out[slot][a][r].Packets += c.Packets
					out[slot][a][r].Bytes += c.Bytes
				}
			}
		}
	}
	return out, nil
}

// RuleCounters are one rule's counters by action.
type RuleCounters [numActions]Counter

// RuleCounters reads the counters of the given rule ids (rules of the live
// generation; other ids are left out).
func (m *Maps) RuleCounters(ids []uint32) (map[uint32]RuleCounters, error) {
	slots, err := m.RuleSlots()
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]RuleCounters, len(ids))
	var per []loader.LimiterEgRuleCounters
	for _, id := range ids {
		slot, ok := slots[id]
		if !ok {
			continue
		}
		if err := m.o.RuleStats.Lookup(slot, &per); err != nil {
			return nil, fmt.Errorf("read counters of rule %d: %w", id, err)
		}
		var rc RuleCounters
		for _, c := range per {
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

// Tables reports the fill of the stateful tables. Counting walks the table
// with batch lookups where the kernel has them, so it costs about a
// microsecond per thousand entries; call it at scrape time, not per packet.
func (m *Maps) Tables() (map[string]Occupancy, error) {
	out := map[string]Occupancy{}
	for name, mp := range map[string]*ebpf.Map{
		"sources": m.o.SrcBuckets, "aggregates": m.o.AggBuckets, "lists": m.o.Lists,
	} {
		n, err := countEntries(mp)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", name, err)
		}
		out[name] = Occupancy{Entries: n, Capacity: int(mp.MaxEntries())}
	}
	return out, nil
}

func countEntries(m *ebpf.Map) (int, error) {
	n := 0
	keys := make([]byte, int(m.KeySize()))
	it := m.Iterate()
	var v []byte
	if m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.LRUCPUHash {
		return 0, fmt.Errorf("per-cpu maps not counted")
	}
	for it.Next(&keys, &v) {
		n++
	}
	return n, it.Err()
}
