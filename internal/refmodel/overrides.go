package refmodel

import (
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// Aggregate overrides (bpf/xdp_limiter.c, "Aggregate overrides and
// watches"): per aggregate instance, a budget that replaces the policy's
// and/or a bucket only new and penalised sources are charged against,
// each part ignored once its own expiry (Expires: the budget's,
// NewExpires: the new-source bucket's) has passed. The program finds them through the rule's gate
// word; maps.Maps keeps a gate bit set for every override in the table, so
// the model looks every aggregate up directly.

// Override is an override's data-plane form (struct eg_override).
type Override = loader.LimiterEgOverride

// More aggregate kinds (enum eg_agg_kind).
const (
	AggKindWhole  = uint8(loader.LimiterEgAggKindEG_AGG_KIND_WHOLE)
	AggKindGlobal = uint8(loader.LimiterEgAggKindEG_AGG_KIND_GLOBAL)
)

// SetOverride installs or replaces the override of the aggregate k as
// maps.OverrideStore.SetMany writes it (v as compiled, Expires and NewExpires
// in the test clock's ns): a replaced override keeps its new-source bucket when it
// keeps its new-source budget, else the bucket starts full. v.NewBucket is
// ignored.
func (m *Model) SetOverride(k AggKey, v Override) {
	if m.ovr == nil {
		m.ovr = map[AggKey]Override{}
	}
	v.NewBucket = Bucket{}
	if old, ok := m.ovr[k]; ok && old.NewBudget == v.NewBudget {
		v.NewBucket = old.NewBucket
	}
	m.ovr[k] = v
}

// DeleteOverride removes the override of k, as maps.OverrideStore.Delete.
func (m *Model) DeleteOverride(k AggKey) { delete(m.ovr, k) }

// Overrides returns the override table (new-source buckets included).
func (m *Model) Overrides() map[AggKey]Override {
	out := make(map[AggKey]Override, len(m.ovr))
	for k, v := range m.ovr {
		out[k] = v
	}
	return out
}

// pruneOverrides is Apply's part (maps.Generations.Commit): overrides of rules
// that are gone, or that no longer have a budget for their aggregate, go.
func (m *Model) pruneOverrides() {
	g := m.gen
	for k := range m.ovr {
		keep := false
		if k.Kind == AggKindGlobal {
			keep = g.globalLim
		} else if r, ok := g.rules[k.RuleId]; ok {
			switch k.Kind {
			case AggKindPrefix:
				want := r.aggLen6
				if isV4Mapped(k.Addr) && k.Len >= 96 {
					want = r.aggLen4 + 96
				}
				keep = r.aggMode == maps.AggDerived && r.aggLim && k.Len == want
			case AggKindWhole:
				keep = r.aggMode == maps.AggWhole && r.aggLim
			case AggKindASN:
				keep = r.asLim
			}
		}
		if !keep {
			delete(m.ovr, k)
		}
	}
}

// ovrFind is ovr_find: the override of an aggregate, nil when there is
// none (its parts' expiries are checked by ovrBudget and chargedNew).
func (m *Model) ovrFind(k AggKey, ss *srcState) (*Override, bool) {
	if m.gate != nil && m.gate[ss.ruleID]&(1<<k.Kind) == 0 {
		return nil, false
	}
	o, ok := m.ovr[k]
	if !ok {
		return nil, false
	}
	return &o, true
}

// ovrBudget is ovr_budget: the override's budget part while it has one and
// it has not expired, else c.
func ovrBudget(o *Override, c maps.BucketCfg, ss *srcState) maps.BucketCfg {
	if o != nil && o.Expires > ss.now>>maps.TickShift && limited(o.Budget) {
		return o.Budget
	}
	return c
}

// chargedNew is charged_new.
func (m *Model) chargedNew(o *Override, ss *srcState) bool {
	if o == nil || o.NewExpires <= ss.now>>maps.TickShift || !limited(o.NewBudget) {
		return false
	}
	cls := m.class(ss, false)
	// An established source whose rate jumped is charged as new inside
	// an aggregate the shield tightened (the new-source part's origin).
	if cls == maps.ClassEstablished && ss.jumped && maps.Origin(o.Origin>>8&0xff) == maps.OriginShield {
		return true
	}
	return !privileged(cls)
}

// ovrPeek is eg_agg_peek with the aggregate's override: its budget
// replaces c, and a new or penalised source must also fit its new-source
// bucket.
func (m *Model) ovrPeek(k AggKey, b Bucket, c maps.BucketCfg, reserve uint16, agg maps.ClassAgg, ss *srcState) bool {
	o, _ := m.ovrFind(k, ss)
	st := m.traceAgg(stepPeek, k, b, c, reserve, o, ss)
	budgetPart := budgetInForce(o, ss)
	c = ovrBudget(o, c, ss)
	if m.chargedNew(o, ss) {
		st.newPart()
		if !wouldAdmit(o.NewBucket, o.NewBudget, ss.now, ss.len) {
			ss.refusedAgg, ss.refusedOutcome = agg, maps.OutcomeRefusedFull
			ss.refusedReason = ovrReason(o.Origin >> 8 & 0xff)
			st.refusedNew()
			return false
		}
	}
	ok := m.aggPeek(b, c, reserve, agg, ss)
	if !ok && budgetPart {
		ss.refusedReason = ovrReason(o.Origin & 0xff)
	}
	st.done(ok, ss)
	return ok
}

// budgetInForce says the override's budget part replaces the policy's
// (ovr_budget returned it).
func budgetInForce(o *Override, ss *srcState) bool {
	return o != nil && o.Expires > ss.now>>maps.TickShift && limited(o.Budget)
}

// ovrReason is ovr_reason: the drop reason of a refusal by an override
// part, named by the part's writer.
func ovrReason(origin uint32) maps.Reason {
	switch maps.Origin(origin) {
	case maps.OriginShield:
		return maps.ReasonShieldTighten
	case maps.OriginFleet:
		return maps.ReasonFleetShare
	}
	return maps.ReasonOverride
}

// ovrTake is eg_agg_take with the aggregate's override: the new-source
// bucket is charged first and given back (by subtraction) if the
// aggregate refuses.
func (m *Model) ovrTake(k AggKey, b *Bucket, c maps.BucketCfg, reserve uint16, agg maps.ClassAgg, ss *srcState) bool {
	o, _ := m.ovrFind(k, ss)
	st := m.traceAgg(stepCharge, k, *b, c, reserve, o, ss)
	budgetPart := budgetInForce(o, ss)
	c = ovrBudget(o, c, ss)
	fresh := m.chargedNew(o, ss)
	if fresh {
		st.newPart()
		ok := take(&o.NewBucket, o.NewBudget, ss.now, ss.len)
		m.ovr[k] = *o
		if !ok {
			ss.refusedAgg, ss.refusedOutcome = agg, maps.OutcomeRefusedFull
			ss.refusedReason = ovrReason(o.Origin >> 8 & 0xff)
			st.refusedNew()
			return false
		}
	}
	ok := m.aggTake(b, c, reserve, agg, ss)
	st.done(ok, ss)
	if !ok && budgetPart {
		ss.refusedReason = ovrReason(o.Origin & 0xff)
	}
	if !ok {
		if fresh {
			if o.NewBudget.PktT != 0 {
				o.NewBucket.PktTat -= o.NewBudget.PktT
			}
			if o.NewBudget.ByteT != 0 {
				o.NewBucket.ByteTat -= maps.ByteCost(o.NewBudget, ss.len)
			}
			m.ovr[k] = *o
		}
		return false
	}
	return true
}
