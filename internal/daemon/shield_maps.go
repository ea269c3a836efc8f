package daemon

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// The shield's side of the maps: which aggregates the data plane counts
// for it, the counters it reads every interval, and the overrides it
// writes.

// watch asks the data plane to count every instance of the
// aggregates the shield can tighten (prefix, ASN, whole, global) and
// returns the rule shapes with Counted set where it does. The shield's
// watches it no longer needs go (Overrides.Unwatch: unless fleet mode
// holds them too). c nil: the shield is off and needs none.
func (st *shieldRun) watch(c *policy.Compiled) (map[uint32]shield.RuleShape, shield.GlobalShape) {
	want := map[maps.Watch]bool{}
	defer st.unwatch(want)
	if c == nil {
		return nil, shield.GlobalShape{}
	}
	shapes := ruleShapes(c)
	for id, s := range shapes {
		ok := true
		watch := func(kind maps.AggKind) {
			want[maps.Watch{RuleID: id, Kind: kind}] = true
			if err := st.m.Overrides.Watch(id, kind, maps.OriginShield); err != nil {
				ok = false
				st.log.Warn("shield: the data plane does not count this rule's aggregates; the shield learns them from samples",
					"rule", id, "kind", kind, "err", err)
			}
		}
		if s.PrefixLen4 != 0 || s.PrefixLen6 != 0 {
			watch(maps.AggKindPrefix)
		}
		if s.Whole {
			watch(maps.AggKindWhole)
		}
		if s.ASN {
			watch(maps.AggKindASN)
		}
		s.Counted = ok
		shapes[id] = s
	}
	g := shield.GlobalShape{Limited: c.Global.IsSet()}
	if g.Limited {
		want[maps.Watch{Kind: maps.AggKindGlobal}] = true
		if err := st.m.Overrides.Watch(0, maps.AggKindGlobal, maps.OriginShield); err != nil {
			st.log.Warn("shield: the data plane does not count the global bucket", "err", err)
		} else {
			g.Counted = true
		}
	}
	return shapes, g
}

// unwatch lets go of the shield's watches not in want.
func (st *shieldRun) unwatch(want map[maps.Watch]bool) {
	for w := range st.m.Overrides.WatchedBy(maps.OriginShield) {
		if want[w] {
			continue
		}
		if err := st.m.Overrides.Unwatch(w.RuleID, w.Kind, maps.OriginShield); err != nil {
			st.log.Warn("shield: stop counting aggregates it no longer needs", "rule", w.RuleID, "kind", w.Kind, "err", err)
		}
	}
}

// shieldKey is the shield's key of a data-plane aggregate.
func shieldKey(a maps.Aggregate) (shield.Key, bool) {
	switch a.Kind {
	case maps.AggKindPrefix:
		return shield.Key{Kind: shield.KindPrefix, Rule: a.RuleID, Prefix: a.Prefix}, true
	case maps.AggKindASN:
		return shield.Key{Kind: shield.KindASN, Rule: a.RuleID, ASN: a.ASN}, true
	case maps.AggKindWhole:
		return shield.Key{Kind: shield.KindRule, Rule: a.RuleID}, true
	case maps.AggKindGlobal:
		return shield.Key{Kind: shield.KindGlobal}, true
	}
	return shield.Key{}, false
}

// mapsAggregate is the data-plane aggregate of a tightenable key.
func mapsAggregate(k shield.Key) (maps.Aggregate, error) {
	switch k.Kind {
	case shield.KindPrefix:
		return maps.Aggregate{RuleID: k.Rule, Kind: maps.AggKindPrefix, Prefix: k.Prefix}, nil
	case shield.KindASN:
		return maps.Aggregate{RuleID: k.Rule, Kind: maps.AggKindASN, ASN: k.ASN}, nil
	case shield.KindRule:
		return maps.Aggregate{RuleID: k.Rule, Kind: maps.AggKindWhole}, nil
	case shield.KindGlobal:
		return maps.Aggregate{Kind: maps.AggKindGlobal}, nil
	}
	return maps.Aggregate{}, fmt.Errorf("%s has no bucket in the data plane", k)
}

// aggCounts remembers the last counter reading of each aggregate, for
// deltas.
type aggCounts map[maps.Aggregate]maps.Counter

// count feeds the counters' deltas since the last interval to the
// engine. A counter that went down was evicted and restarted: its delta
// is what it holds now.
func (st *shieldRun) count(eng *shield.Engine) {
	cs, err := st.m.Overrides.AggregateCounters()
	if err != nil {
		st.log.Warn("shield: read aggregate counters", "err", err)
		return
	}
	next := make(aggCounts, len(cs))
	for _, c := range cs {
		cur := maps.Counter{Packets: c.Passed.Packets + c.Dropped.Packets, Bytes: c.Passed.Bytes + c.Dropped.Bytes}
		next[c.Aggregate] = cur
		prev, seen := st.counts[c.Aggregate]
		if !seen && st.counts != nil {
			prev = maps.Counter{} // new since the last reading
		} else if !seen {
			continue // the first reading is the starting point
		}
		dp, db := cur.Packets-prev.Packets, cur.Bytes-prev.Bytes
		if cur.Packets < prev.Packets {
			dp, db = cur.Packets, cur.Bytes
		}
		if k, ok := shieldKey(c.Aggregate); ok && dp > 0 {
			eng.Count(k, float64(dp), float64(db))
		}
	}
	st.counts = next
}

// toShieldSample resolves a ring-buffer sample for the shield: only the
// data plane's 1-in-N samples carry a weight that stands for a rate.
func toShieldSample(s maps.Sample, slotToID map[uint32]uint32, table *asn.Table) (shield.Sample, bool) {
	w, ok := sampleWeight(s)
	if !ok || !s.Source.IsValid() {
		return shield.Sample{}, false
	}
	id, ok := slotToID[s.RuleSlot]
	if !ok {
		return shield.Sample{}, false
	}
	out := shield.Sample{Src: s.Source, ASN: s.ASN, Rule: id, Proto: s.Proto, SPort: s.SPort, DPort: s.DPort,
		Len: s.Len, Weight: w}
	sampleFields(&out, s)
	if table != nil {
		if e, ok := table.Lookup(s.Source); ok {
			out.Country = e.Country
		}
	}
	return out, true
}

// write writes an enforced change to the data plane.
func (st *shieldRun) write(c shield.Change) error {
	a := c.Action
	switch a.Kind {
	case shield.Tighten:
		agg, err := mapsAggregate(a.Key)
		if err != nil {
			return err
		}
		if c.Op == shield.OpRemove {
			return st.m.Overrides.Delete(agg, maps.OriginShield)
		}
		n := uint64(math.Ceil(a.Budget))
		return st.m.Overrides.Set(maps.Override{Aggregate: agg, NewBudget: maps.Rate{Count: n, Per: time.Second, Burst: max(n, 1)},
			Expires: a.Expires, Origin: maps.OriginShield})
	case shield.FingerprintRule:
		return st.writeFingerprint(c)
	}
	return fmt.Errorf("shield action kind %q unknown", a.Kind)
}

// asnOfPrefix is the ASN data's ASN of a prefix (of its first address).
func asnOfPrefix(t *asn.Table) func(netip.Prefix) uint32 {
	return func(p netip.Prefix) uint32 {
		if t == nil {
			return 0
		}
		if e, ok := t.Lookup(p.Addr()); ok {
			return e.ASN
		}
		return 0
	}
}

// adopt takes the shield's actions found in the data plane at start
// (pinned overrides' new-source parts and fingerprints written by the
// shield: an earlier run's, which a crash left in force) into a new
// engine, so that `edgectl shield list`, release and the metrics see
// them; each stays until its expiry, not renewed. Each is logged.
func (st *shieldRun) adopt(eng *shield.Engine, now time.Time) {
	fps, err := st.m.Fingerprints.All()
	if err != nil {
		st.log.Error("shield: read the data plane's fingerprints; those of an earlier run are not listed (they expire)", "err", err)
	}
	for _, f := range fps {
		if f.Origin != maps.OriginShield || !f.Expires.After(now) {
			continue
		}
		sf := shield.Fingerprint{Proto: f.Proto, DPort: f.DPort, SPort: f.SPort, Len: f.Len, TTL: f.TTL, TCPFlags: f.TCPFlags, Src: f.Src}
		for _, fm := range fieldMasks {
			if f.Mask&fm.m != 0 {
				sf.Mask |= fm.s
			}
		}
		a, ok := eng.Adopt(shield.Action{ID: f.ID, Kind: shield.FingerprintRule, Fingerprint: &sf, Budget: ratePPS(f.Budget),
			Expires: f.Expires}, now)
		if ok {
			st.log.Info("shield: adopted an action found in the data plane", "id", a.ID, "kind", a.Kind, "fingerprint", sf.String(),
				"budget_pps", a.Budget, "expires", a.Expires)
		}
	}
	ovrs, err := st.m.Overrides.All()
	if err != nil {
		st.log.Error("shield: read the data plane's overrides; those of an earlier run are not listed (they expire)", "err", err)
	}
	for _, o := range ovrs {
		for _, p := range o.Parts {
			if !p.NewSource || p.Origin != maps.OriginShield {
				continue
			}
			k, ok := shieldKey(o.Aggregate)
			if !ok {
				continue
			}
			a, ok := eng.Adopt(shield.Action{Kind: shield.Tighten, Key: k, Budget: ratePPS(o.NewBudget), Expires: p.Expires}, now)
			if ok {
				st.log.Info("shield: adopted an action found in the data plane", "id", a.ID, "kind", a.Kind, "aggregate", k.String(),
					"budget_pps", a.Budget, "expires", a.Expires)
			}
		}
	}
}

// ratePPS is a rate in packets per second.
func ratePPS(r maps.Rate) float64 {
	if r.Per <= 0 {
		return 0
	}
	return float64(r.Count) / r.Per.Seconds()
}

// leftovers says, with the shield off at start, which of an earlier
// run's shield actions the data plane still holds: nothing adopts them;
// they stay until they expire, or `edgectl show remove` removes them.
func (st *shieldRun) leftovers(now time.Time) {
	fps, err := st.m.Fingerprints.All()
	if err != nil {
		st.log.Warn("shield: read the data plane's fingerprints", "err", err)
	}
	for _, f := range fps {
		if f.Origin == maps.OriginShield {
			st.log.Warn("shield off: an earlier run's fingerprint stays in force until it expires (edgectl show remove fingerprint ID)",
				"id", f.ID, "fingerprint", f.Match(), "expires", f.Expires)
		}
	}
	ovrs, err := st.m.Overrides.All()
	if err != nil {
		st.log.Warn("shield: read the data plane's overrides", "err", err)
	}
	for _, o := range ovrs {
		for _, p := range o.Parts {
			if p.Origin == maps.OriginShield && p.Expires.After(now) {
				st.log.Warn("shield off: an earlier run's tighten stays in force until it expires (edgectl show remove override AGGREGATE --origin shield)",
					"aggregate", o.Aggregate.String(), "expires", p.Expires)
			}
		}
	}
}
