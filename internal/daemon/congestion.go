package daemon

import (
	"cmp"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// maxCongestedInstances bounds the aggregate instances (one ASN, one
// prefix, one rule's whole aggregate, the global bucket) whose congestion
// is tracked: a flood over thousands of /24s must not grow the daemon.
// Past it, the least-refusing instance gives way (Space-Saving), so the
// table holds the most-refusing ones.
const maxCongestedInstances = 64

// instKey names one aggregate instance.
type instKey struct {
	agg    maps.ClassAgg
	rule   uint32       // rule id; 0 for global
	asn    uint32       // ASN instances
	prefix netip.Prefix // derived per-prefix instances; zero for a whole aggregate
}

// instance is one aggregate instance's congestion, from the drop samples
// that an aggregate refused (sample.Refusal).
type instance struct {
	since    time.Time // first refusal sampled
	lastSeen time.Time // last refusal sampled
	entered  bool      // the enter event was logged
	// refused counts the sampled refusals by outcome (reserve, full) and
	// by the refused source's class; over is how many of them may belong
	// to instances this one replaced (Space-Saving's error bound).
	reserve, full uint64
	byClass       [maps.ClassUnknown + 1]uint64
	// byReason splits them by who decided: the policy's budget or an
	// override part (shield_tighten, fleet_share, override).
	byReason map[maps.Reason]uint64
	over     uint64
}

// refused is the Space-Saving count the table ranks by: the sampled
// refusals plus the inherited bound.
func (i *instance) refused() uint64 { return i.reserve + i.full + i.over }

// slotRule is what the instance watch needs of a rule table slot.
type slotRule struct {
	id        uint32
	name      string
	aggregate policy.AggregateMode
	key       policy.KeyBits
}

// instances is the per-instance congestion state (inside standingWatch,
// under its lock).
type instances struct {
	m       map[instKey]*instance
	slots   map[uint32]slotRule // rule table slot -> rule, refreshed each tick
	evicted uint64              // instances replaced by more-refusing ones
	unknown uint64              // refusals from a slot with no known rule
}

// refusingAgg is the kind of aggregate that refused s: the reason's for
// the policy's own budgets (as every program's samples say it), the
// sample's RefusedAgg when an override refused (its reason names who
// wrote the override, not the aggregate); false for a sample no
// aggregate refused.
func refusingAgg(s maps.Sample) (maps.ClassAgg, bool) {
	if !s.Refusal {
		return 0, false
	}
	switch s.Reason {
	case maps.ReasonGlobalLimit:
		return maps.ClassAggGlobal, true
	case maps.ReasonASNLimit:
		return maps.ClassAggASN, true
	case maps.ReasonPrefixLimit:
		return maps.ClassAggPrefix, true
	case maps.ReasonShieldTighten, maps.ReasonFleetShare, maps.ReasonOverride:
		return s.RefusedAgg, s.RefusedAgg <= maps.ClassAggGlobal
	}
	return 0, false
}

// keyOf names the instance that refused s; false for a sample no
// aggregate refused.
func (in *instances) keyOf(s maps.Sample) (instKey, slotRule, bool) {
	agg, ok := refusingAgg(s)
	if !ok {
		return instKey{}, slotRule{}, false
	}
	if agg == maps.ClassAggGlobal {
		return instKey{agg: maps.ClassAggGlobal}, slotRule{}, true
	}
	r, ok := in.slots[s.RuleSlot]
	if !ok {
		in.unknown++
		return instKey{}, slotRule{}, false
	}
	if agg == maps.ClassAggASN {
		return instKey{agg: maps.ClassAggASN, rule: r.id, asn: s.ASN}, r, true
	}
	k := instKey{agg: maps.ClassAggPrefix, rule: r.id}
	if r.aggregate == policy.AggregateDerived {
		bits := int(r.key.V6)
		if s.Source.Is4() {
			bits = int(r.key.V4)
		}
		p, err := s.Source.Prefix(bits)
		if err != nil {
			return instKey{}, slotRule{}, false
		}
		k.prefix = p
	}
	return k, r, true
}

// add counts one drop sample.
func (in *instances) add(now time.Time, s maps.Sample) {
	k, _, ok := in.keyOf(s)
	if !ok {
		return
	}
	if in.m == nil {
		in.m = map[instKey]*instance{}
	}
	it := in.m[k]
	if it == nil {
		it = &instance{since: now}
		if len(in.m) >= maxCongestedInstances {
			// Space-Saving: the least-refusing instance gives way and
			// the new one inherits its count as possible error.
			var minK instKey
			var minI *instance
			for ok, oi := range in.m {
				if minI == nil || oi.refused() < minI.refused() ||
					(oi.refused() == minI.refused() && oi.lastSeen.Before(minI.lastSeen)) {
					minK, minI = ok, oi
				}
			}
			delete(in.m, minK)
			in.evicted++
			it.over = minI.refused()
		}
		in.m[k] = it
	}
	it.lastSeen = now
	if s.Refused == maps.OutcomeRefusedReserve {
		it.reserve++
	} else {
		it.full++
	}
	if int(s.Class) < len(it.byClass) {
		it.byClass[s.Class]++
	}
	if it.byReason == nil {
		it.byReason = map[maps.Reason]uint64{}
	}
	it.byReason[s.Reason]++
}

// observe logs the instances that entered congestion since the last tick
// and removes, with a log line, those that refused nothing sampled for
// congestionCalm.
func (in *instances) observe(log *slog.Logger, now time.Time) {
	for k, it := range in.m {
		switch {
		case now.Sub(it.lastSeen) >= congestionCalm:
			if it.entered {
				log.Info("aggregate instance left congestion", append(in.attrs(k),
					"lasted", it.lastSeen.Sub(it.since).Round(time.Second),
					"refused_reserve_sampled", it.reserve, "refused_full_sampled", it.full,
					"refused_by_class", classCounts(it), "refused_by_reason", reasonCounts(it))...)
			}
			delete(in.m, k)
		case !it.entered:
			it.entered = true
			log.Warn("aggregate instance congested: refusing sources", append(in.attrs(k),
				"since", it.since.UTC().Format(time.RFC3339), "refused_reserve_sampled", it.reserve,
				"refused_full_sampled", it.full)...)
		}
	}
}

func (in *instances) ruleName(id uint32) string {
	for _, r := range in.slots {
		if r.id == id {
			return r.name
		}
	}
	return "rule " + strconv.FormatUint(uint64(id), 10)
}

func (in *instances) attrs(k instKey) []any {
	a := []any{"aggregate", maps.ClassAggName(k.agg)}
	if k.agg != maps.ClassAggGlobal {
		a = append(a, "rule", in.ruleName(k.rule))
	}
	switch {
	case k.agg == maps.ClassAggASN:
		a = append(a, "asn", k.asn)
	case k.prefix.IsValid():
		a = append(a, "prefix", k.prefix.String())
	case k.agg == maps.ClassAggPrefix:
		a = append(a, "prefix", "whole")
	}
	return a
}

func reasonCounts(it *instance) map[string]uint64 {
	out := map[string]uint64{}
	for r, n := range it.byReason {
		out[maps.ReasonName(r)] = n
	}
	return out
}

func classCounts(it *instance) map[string]uint64 {
	out := map[string]uint64{}
	for c, n := range it.byClass {
		if n != 0 {
			out[maps.ClassName(maps.Class(c))] = n
		}
	}
	return out
}

// status lists the congested instances, most-refusing first; share is an
// instance's part of its kind's sampled refusals.
func (in *instances) status(now time.Time) []control.CongestedInstance {
	var total [maps.ClassAggGlobal + 1]uint64
	for k, it := range in.m {
		total[k.agg] += it.refused()
	}
	out := make([]control.CongestedInstance, 0, len(in.m))
	for k, it := range in.m {
		if !it.entered {
			continue
		}
		c := control.CongestedInstance{
			Aggregate: maps.ClassAggName(k.agg), ASN: k.asn,
			Since: it.since, For: control.Duration(now.Sub(it.since)), LastRefused: it.lastSeen,
			RefusedReserve: it.reserve, RefusedFull: it.full, RefusedByClass: classCounts(it), RefusedByReason: reasonCounts(it), Overcount: it.over,
			Share: float64(it.refused()) / float64(max(total[k.agg], 1)),
		}
		if k.agg != maps.ClassAggGlobal {
			c.Rule = in.ruleName(k.rule)
		}
		if k.prefix.IsValid() {
			c.Prefix = k.prefix.String()
		} else if k.agg == maps.ClassAggPrefix {
			c.Prefix = "whole"
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b control.CongestedInstance) int {
		if c := cmp.Compare(b.RefusedReserve+b.RefusedFull, a.RefusedReserve+a.RefusedFull); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Aggregate, b.Aggregate), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.ASN, b.ASN),
			cmp.Compare(a.Prefix, b.Prefix))
	})
	return out
}

// congestedByKind counts the congested instances per aggregate kind, for
// the metrics.
func (in *instances) congestedByKind() map[string]int {
	out := map[string]int{}
	for agg := maps.ClassAggPrefix; agg <= maps.ClassAggGlobal; agg++ {
		out[maps.ClassAggName(agg)] = 0
	}
	for k, it := range in.m {
		if it.entered {
			out[maps.ClassAggName(k.agg)]++
		}
	}
	return out
}

// ruleSlots is the live generation's rule table slots, named by the
// generation followed, for the instance watch.
func (w *standingWatch) ruleSlots() map[uint32]slotRule {
	slots, err := w.gens.RuleSlots()
	if err != nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gen == nil {
		return nil
	}
	out := map[uint32]slotRule{}
	for _, r := range w.gen.Rules {
		if slot, ok := slots[r.ID]; ok {
			out[slot] = slotRule{id: r.ID, name: cmp.Or(r.Name, w.names[r.ID]), aggregate: r.Aggregate, key: r.AggregateKey}
		}
	}
	return out
}

// tickInstances refreshes the rule slots and logs the instances'
// congestion changes; one tick of standingWatch.run.
func (w *standingWatch) tickInstances(log *slog.Logger, slots map[uint32]slotRule, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if slots != nil {
		w.inst.slots = slots
	}
	w.inst.observe(log, now)
}

// congestionSample hands a drop sample to the instance watch.
func (w *standingWatch) congestionSample(now time.Time, s maps.Sample) {
	if !s.Refusal {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inst.add(now, s)
}

// instanceStatus is the congested instances for status and stats.
func (w *standingWatch) instanceStatus(now time.Time) []control.CongestedInstance {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inst.status(now)
}
