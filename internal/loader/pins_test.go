package loader_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// TestWholeBucketsFromOldPins: pins of a version that kept whole
// aggregates in agg_buckets (no whole_buckets pin) re-open with each live
// whole aggregate moved to its rule's slot; pins that have whole_buckets
// are left as they are.
func TestWholeBucketsFromOldPins(t *testing.T) {
	requireRoot(t)
	pinDir := fmt.Sprintf("/sys/fs/bpf/eg-test-%d-whole-pins", os.Getpid())
	t.Cleanup(func() { loader.Unpin(pinDir) })
	open := func() *testDatapath { return openPinnedTestDatapath(t, smallSizes, pinDir) }
	const wholeID, derivedID = 0x9e3779b9, 7 // a name hash and a small id
	agg := policy.Bucket{Packets: perSecond(10, 5)}
	g := defaultGen(policy.CompiledRule{ID: 0, PerSource: policy.Bucket{Packets: perSecond(1000, 10)}, SourceKey: policy.KeyBits{V4: 32, V6: 64}})
	g.Rules = append(g.Rules,
		policy.CompiledRule{ID: wholeID, PerPrefix: agg, Aggregate: policy.AggregateWhole},
		policy.CompiledRule{ID: derivedID, PerPrefix: agg, Aggregate: policy.AggregateDerived, AggregateKey: policy.KeyBits{V4: 24, V6: 48}})
	oldKey := func(id uint32) loader.LimiterEgAggKey {
		return loader.LimiterEgAggKey{RuleId: id, Kind: uint8(loader.LimiterEgAggKindEG_AGG_KIND_PREFIX)}
	}
	state := loader.LimiterEgBucket{PktTat: 123456789, ByteTat: 987654321}

	first := open()
	first.apply(g)
	slots, err := first.m.Generations.RuleSlots()
	if err != nil {
		t.Fatal(err)
	}
	// What the previous version left: whole aggregates under the length-0
	// prefix key. The derived rule's entry is not a whole aggregate.
	for _, id := range []uint32{wholeID, derivedID} {
		if err := first.d.Objects.AggBuckets.Put(oldKey(id), state); err != nil {
			t.Fatal(err)
		}
	}
	first.d.Close()
	if err := os.Remove(filepath.Join(pinDir, "maps", loader.LimiterMapWholeBuckets)); err != nil {
		t.Fatal(err)
	}

	second := open()
	var b loader.LimiterEgBucket
	if err := second.d.Objects.WholeBuckets.Lookup(slots[wholeID], &b); err != nil {
		t.Fatal(err)
	}
	if b != state {
		t.Errorf("whole_buckets[%d] after re-open from old pins: %+v, want %+v", slots[wholeID], b, state)
	}
	if err := second.d.Objects.AggBuckets.Lookup(oldKey(wholeID), &b); err == nil {
		t.Error("the moved whole aggregate is still in agg_buckets")
	}
	if err := second.d.Objects.WholeBuckets.Lookup(slots[derivedID], &b); err != nil || b != (loader.LimiterEgBucket{}) {
		t.Errorf("derived rule's slot of whole_buckets: %+v (%v), want empty", b, err)
	}
	if err := second.d.Objects.AggBuckets.Lookup(oldKey(derivedID), &b); err != nil {
		t.Errorf("derived rule's agg_buckets entry was touched: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pinDir, "maps", loader.LimiterMapWholeBuckets)); err != nil {
		t.Errorf("whole_buckets not pinned: %v", err)
	}

	// With whole_buckets pinned, a re-open moves nothing.
	if err := second.d.Objects.AggBuckets.Put(oldKey(wholeID), loader.LimiterEgBucket{PktTat: 1}); err != nil {
		t.Fatal(err)
	}
	second.d.Close()
	third := open()
	if err := third.d.Objects.WholeBuckets.Lookup(slots[wholeID], &b); err != nil || b != state {
		t.Errorf("whole_buckets[%d] after a plain re-open: %+v (%v), want %+v", slots[wholeID], b, err, state)
	}
	if err := third.d.Objects.AggBuckets.Lookup(oldKey(wholeID), &b); err != nil {
		t.Errorf("agg_buckets entry gone after a plain re-open: %v", err)
	}
}

// TestStatsPinOfFewerReasons: pins of a version with fewer drop reasons
// (a smaller stats map) are re-opened; the counters start over, every
// other map keeps its state.
func TestStatsPinOfFewerReasons(t *testing.T) {
	requireRoot(t)
	pinDir := fmt.Sprintf("/sys/fs/bpf/eg-test-%d-stats-pins", os.Getpid())
	t.Cleanup(func() { loader.Unpin(pinDir) })
	first := openPinnedTestDatapath(t, smallSizes, pinDir)
	want := first.d.Objects.Stats.MaxEntries()
	key := loader.LimiterEgStandingKey{Addr: [16]byte{10: 0xff, 11: 0xff, 12: 198, 13: 18, 14: 0, 15: 7}}
	if err := first.d.Objects.Standing.Put(key, loader.LimiterEgStandingVal{Standing: 1, Since: 5}); err != nil {
		t.Fatal(err)
	}
	first.d.Close()
	// The old version's stats: 19 reasons.
	path := filepath.Join(pinDir, "maps", loader.LimiterMapStats)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16,
		MaxEntries: uint32(loader.LimiterEgSizesEG_IFACE_SLOTS) * 3 * 19})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}
	old.Close()

	second := openPinnedTestDatapath(t, smallSizes, pinDir)
	if got := second.d.Objects.Stats.MaxEntries(); got != want {
		t.Errorf("stats after re-open: %d entries, want %d", got, want)
	}
	var v loader.LimiterEgStandingVal
	if err := second.d.Objects.Standing.Lookup(key, &v); err != nil || v.Standing != 1 {
		t.Errorf("standing after re-open: %+v, %v: want the entry kept", v, err)
	}
}
