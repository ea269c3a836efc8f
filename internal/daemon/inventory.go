package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/edgeguard/edgeguard/internal/bgp"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// `edgectl show`: what is installed in the data plane besides the policy's
// rules, read from its pinned maps (docs/operations.md, "What is
// installed"), and the removal of one entry.

func (d *Daemon) inventoryRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/dataplane", func(w http.ResponseWriter, r *http.Request) {
		inv, err := d.Inventory()
		if err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, inv)
	})
	mux.Handle("POST /v1/dataplane/remove", d.rootOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req control.RemoveRequest
		if !decodeBody(w, r, maxSmallBody, "remove request", &req) {
			return
		}
		uid, _ := r.Context().Value(peerUIDKey{}).(int)
		by := fmt.Sprintf("uid %d", uid)
		if req.By != "" {
			by = fmt.Sprintf("%.64s (uid %d)", req.By, uid)
		}
		res, err := d.RemoveInstalled(req, by)
		switch {
		case errors.Is(err, errNotInstalled):
			writeError(w, http.StatusNotFound, err)
		case err != nil:
			writeError(w, http.StatusUnprocessableEntity, err)
		default:
			writeJSON(w, res)
		}
	})))
}

var errNotInstalled = errors.New("not installed in the data plane")

// Inventory reads the lists, override parts, fingerprints and mask slots
// from the data plane's maps.
func (d *Daemon) Inventory() (control.Inventory, error) {
	inv := control.Inventory{Read: time.Now(), Lists: []control.InventoryList{}, Overrides: []control.InventoryOverride{},
		Fingerprints: []control.InventoryFingerprint{}, Masks: []control.InventoryFingerprintM{}, BGP: []control.InventoryBGP{}}
	mono, err := maps.MonoNow()
	if err != nil {
		return inv, err
	}
	wallOf := func(ns uint64) *time.Time {
		if ns == 0 || ns == maps.Forever {
			return nil
		}
		t := inv.Read.Add(time.Duration(int64(ns) - int64(mono)))
		return &t
	}
	lists, err := d.m.Lists.All()
	if err != nil {
		return inv, err
	}
	for _, e := range lists {
		for _, p := range []struct {
			kind  control.ListKind
			until uint64
		}{{control.Deny, e.DenyUntil}, {control.Allow, e.AllowUntil}} {
			if p.until <= mono {
				continue
			}
			inv.Lists = append(inv.Lists, control.InventoryList{List: p.kind, Prefix: e.Prefix, Origin: maps.OriginName(e.Origin),
				Expires: wallOf(p.until), Remove: fmt.Sprintf("edgectl %s del %s", p.kind, e.Prefix)})
		}
	}
	names := d.ruleNames()
	ovrs, err := d.m.Overrides.All()
	if err != nil {
		return inv, err
	}
	counters := map[maps.Aggregate]maps.AggregateCounters{}
	if cs, err := d.m.Overrides.AggregateCounters(); err == nil {
		for _, c := range cs {
			counters[c.Aggregate] = c
		}
	} else {
		d.log.Warn("show: read aggregate counters", "err", err)
	}
	for _, o := range ovrs {
		for _, p := range o.Parts {
			x := control.InventoryOverride{Aggregate: o.Aggregate.String(), Origin: maps.OriginName(p.Origin), Part: "budget",
				Limit: rateText(o.Budget)}
			if o.Aggregate.Kind != maps.AggKindGlobal {
				x.Rule = names[o.Aggregate.RuleID]
			}
			if p.NewSource {
				x.Part, x.Limit = "new_source", rateText(o.NewBudget)
			}
			t := p.Expires
			x.Expires = &t
			if c, ok := counters[o.Aggregate]; ok {
				x.Passed = &control.Counter{Packets: c.Passed.Packets, Bytes: c.Passed.Bytes}
				x.Dropped = &control.Counter{Packets: c.Dropped.Packets, Bytes: c.Dropped.Bytes}
			}
			x.Remove = fmt.Sprintf("edgectl show remove override %q --origin %s", x.Aggregate, x.Origin)
			inv.Overrides = append(inv.Overrides, x)
		}
	}
	slots, err := d.m.Fingerprints.Slots()
	if err != nil {
		return inv, err
	}
	fps, err := d.m.Fingerprints.All()
	if err != nil {
		return inv, err
	}
	inSlot := map[int]int{}
	for _, f := range fps {
		slot := maps.SlotOf(slots, f.Fingerprint)
		inSlot[slot]++
		x := control.InventoryFingerprint{ID: f.ID, Match: f.Match(), Slot: slot, Origin: maps.OriginName(f.Origin),
			Limit: rateText(f.Budget), DryRun: f.DryRun, Remove: fmt.Sprintf("edgectl show remove fingerprint %d", f.ID),
			Matched: control.Counter(f.Matched), Dropped: control.Counter(f.Dropped), Spared: control.Counter(f.Spared)}
		t := f.Expires
		x.Expires = &t
		inv.Fingerprints = append(inv.Fingerprints, x)
	}
	slices.SortFunc(inv.Fingerprints, func(a, b control.InventoryFingerprint) int { return int(a.ID) - int(b.ID) })
	for _, s := range slots {
		inv.Masks = append(inv.Masks, control.InventoryFingerprintM{Slot: s.Slot, Fields: maps.MaskName(s.Mask), SrcLen: s.SrcLen,
			Fingerprints: inSlot[s.Slot]})
	}
	if sp, p := d.bgp.get(); sp != nil {
		for _, a := range bgpAnnouncements(sp, p) {
			inv.BGP = append(inv.BGP, control.InventoryBGP{BGPAnnouncement: a, Remove: fmt.Sprintf("edgectl show remove bgp %d", a.ID)})
		}
	}
	return inv, nil
}

// rateText writes a rate as "50/s burst 50" ("" for none).
func rateText(r maps.Rate) string {
	if r.Count == 0 || r.Per <= 0 {
		return ""
	}
	return fmt.Sprintf("%.4g/s burst %d", float64(r.Count)/r.Per.Seconds(), r.Burst)
}

var originByName = map[string]maps.Origin{
	"shield": maps.OriginShield, "fleet": maps.OriginFleet, "cli": maps.OriginCLI, "policy": maps.OriginPolicy, "l7": maps.OriginL7,
}

// RemoveInstalled removes one override's parts of an origin, or one
// fingerprint. What the shield holds as an action is released through it
// (so it is not written again); other entries are deleted from the maps.
func (d *Daemon) RemoveInstalled(req control.RemoveRequest, by string) (control.RemoveResult, error) {
	eng := d.shieldEngine()
	switch req.Kind {
	case "fingerprint":
		if req.ID == 0 {
			return control.RemoveResult{}, errors.New("remove fingerprint: give its id")
		}
		fps, err := d.m.Fingerprints.All()
		if err != nil {
			return control.RemoveResult{}, err
		}
		i := slices.IndexFunc(fps, func(f maps.FingerprintState) bool { return f.ID == req.ID })
		if i < 0 {
			return control.RemoveResult{}, fmt.Errorf("fingerprint %d: %w", req.ID, errNotInstalled)
		}
		what := fmt.Sprintf("fingerprint %d (%s, %s)", req.ID, fps[i].Match(), maps.OriginName(fps[i].Origin))
		if eng != nil && fps[i].Origin == maps.OriginShield && eng.Holds(req.ID) {
			if err := d.ShieldDo("release", control.ShieldRequest{ID: req.ID}, by); err != nil {
				return control.RemoveResult{}, err
			}
			return control.RemoveResult{Removed: what, Note: "released the shield's action " + strconv.Itoa(int(req.ID))}, nil
		}
		if err := d.m.Fingerprints.Delete(req.ID); err != nil {
			return control.RemoveResult{}, err
		}
		d.log.Info("data plane entry removed", "what", what, "by", by)
		return control.RemoveResult{Removed: what}, nil
	case "override":
		agg, err := maps.ParseAggregate(req.Aggregate)
		if err != nil {
			return control.RemoveResult{}, err
		}
		origin, ok := originByName[req.Origin]
		if !ok {
			return control.RemoveResult{}, fmt.Errorf("bad origin %q: use shield, fleet or cli", req.Origin)
		}
		ovrs, err := d.m.Overrides.All()
		if err != nil {
			return control.RemoveResult{}, err
		}
		found := false
		for _, o := range ovrs {
			for _, p := range o.Parts {
				found = found || (o.Aggregate == agg && p.Origin == origin)
			}
		}
		if !found {
			return control.RemoveResult{}, fmt.Errorf("override of %s by %s: %w", agg, req.Origin, errNotInstalled)
		}
		what := fmt.Sprintf("the %s parts of the override of %s", req.Origin, agg)
		if k, ok := shieldKey(agg); ok && eng != nil && origin == maps.OriginShield {
			if id := eng.ActionOn(k); id != 0 {
				if err := d.ShieldDo("release", control.ShieldRequest{ID: id}, by); err != nil {
					return control.RemoveResult{}, err
				}
				return control.RemoveResult{Removed: what, Note: "released the shield's action " + strconv.Itoa(int(id))}, nil
			}
		}
		if err := d.m.Overrides.Delete(agg, origin); err != nil {
			return control.RemoveResult{}, err
		}
		d.log.Info("data plane entry removed", "what", what, "by", by)
		res := control.RemoveResult{Removed: what}
		if origin == maps.OriginFleet {
			res.Note = "fleet mode writes this host's share again at its next interval while the fleet runs"
		}
		return res, nil
	case "bgp":
		return d.removeBGP(req.Announcement, by)
	}
	return control.RemoveResult{}, fmt.Errorf("remove %q: use override, fingerprint or bgp (list entries: edgectl deny|allow del)", req.Kind)
}

// shieldEngine is the shield's engine, nil when the shield is off.
func (d *Daemon) shieldEngine() *shield.Engine {
	st := d.shield
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.eng
}

// removeBGP withdraws one BGP announcement through the operator's
// withdraw path (BGPDo, as edgectl bgp withdraw ID), and saves the state.
func (d *Daemon) removeBGP(id uint64, by string) (control.RemoveResult, error) {
	if id == 0 {
		return control.RemoveResult{}, errors.New("remove bgp: give the announcement's id")
	}
	sp, p := d.bgp.get()
	if sp == nil {
		return control.RemoveResult{}, fmt.Errorf("bgp announcement %d: %w (%w)", id, errNotInstalled, errBGPOff)
	}
	i := slices.IndexFunc(sp.List(), func(a bgp.Announcement) bool { return a.ID == id })
	if i < 0 {
		return control.RemoveResult{}, fmt.Errorf("bgp announcement %d: %w", id, errNotInstalled)
	}
	a := sp.List()[i]
	what := fmt.Sprintf("bgp announcement %d (%s %s, %s, %s, %s)", id, a.Kind, a.Route(), a.ActionString(p.Community), a.Origin, a.State)
	if err := d.BGPDo("withdraw", control.BGPRequest{ID: id}, by); err != nil {
		if errors.Is(err, bgp.ErrNotFound) { // expired or withdrawn meanwhile
			return control.RemoveResult{}, fmt.Errorf("bgp announcement %d: %w", id, errNotInstalled)
		}
		return control.RemoveResult{}, err
	}
	d.bgp.save(false)
	res := control.RemoveResult{Removed: what}
	switch a.Origin {
	case "uplink":
		res.Note = "announced again at the next second while the offered rate stays above the threshold"
	case "shield":
		res.Note = "not announced again for this shield action; its fingerprint stays in the data plane"
	}
	return res, nil
}
