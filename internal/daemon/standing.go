package daemon

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// How the daemon watches standing and congestion (docs/operations.md,
// "Standing").
const (
	// congestionTick is how often the class counters are read.
	congestionTick = time.Second
	// congestionCalm is how long an aggregate must refuse no new source
	// before it counts as out of congestion (so that one quiet second in
	// an attack is not two log lines).
	congestionCalm = 5 * time.Second
	// standingSweep is how often the standing table is swept.
	standingSweep = 10 * time.Second
	// standingRetention is how long an established or validated source
	// that sends nothing keeps its entry.
	standingRetention = 24 * time.Hour
)

// congestion is one aggregate kind's congestion state.
type congestion struct {
	since    time.Time // zero: not congested
	lastSeen time.Time // last tick that refused a new source
	// start holds the class counters when the congestion began, for the
	// shares reported when it ends.
	start [maps.ClassAggGlobal + 1][maps.ClassUnknown + 1][4]maps.Counter
}

// standingWatch keeps the congestion state the daemon reports.
type standingWatch struct {
	mu    sync.Mutex
	state [maps.ClassAggGlobal + 1]congestion
	last  maps.ClassCounters
	have  bool
	// inst is the congestion of single aggregate instances, from the drop
	// samples (congestion.go).
	inst instances
}

func refusedReserve(c *maps.ClassCounters, agg maps.ClassAgg) uint64 {
	var n uint64
	for dry := range c {
		for cls := range c[dry][agg] {
			n += c[dry][agg][cls][maps.OutcomeRefusedReserve].Packets
		}
	}
	return n
}

// classShares sums, per class, the packets an aggregate admitted (below
// the band and in it) between two readings.
func classShares(from, to *maps.ClassCounters, agg maps.ClassAgg) map[string]uint64 {
	out := map[string]uint64{}
	for cls := range to[0][agg] {
		var n uint64
		for _, o := range []maps.Outcome{maps.OutcomeAdmitted, maps.OutcomeAdmittedReserve} {
			n += to[0][agg][cls][o].Packets - from[0][agg][cls][o].Packets
		}
		if n != 0 {
			out[maps.ClassName(maps.Class(cls))] = n
		}
	}
	return out
}

// observe takes one reading of the class counters: an aggregate kind that
// refused a new source since the last reading is congested; one that has
// refused none for congestionCalm is not. Entering and leaving are logged.
func (d *Daemon) observeCongestion(w *standingWatch, cur maps.ClassCounters, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.have {
		w.last, w.have = cur, true
		return
	}
	for agg := maps.ClassAggPrefix; agg <= maps.ClassAggGlobal; agg++ {
		st := &w.state[agg]
		refused := refusedReserve(&cur, agg) - refusedReserve(&w.last, agg)
		name := maps.ClassAggName(agg)
		switch {
		case refused > 0 && st.since.IsZero():
			st.since, st.lastSeen = now, now
			st.start = cur[0]
			d.log.Warn("aggregate congested: new and penalised sources are held to the budget less the reserve",
				"aggregate", name, "refused_new", refused)
		case refused > 0:
			st.lastSeen = now
		case !st.since.IsZero() && now.Sub(st.lastSeen) >= congestionCalm:
			from := maps.ClassCounters{cur[0]}
			from[0] = st.start
			d.log.Info("aggregate left congestion", "aggregate", name,
				"lasted", now.Sub(st.since).Round(time.Second), "admitted_by_class", classShares(&from, &cur, agg))
			st.since = time.Time{}
		}
	}
	w.last = cur
}

// congestionStatus is the congestion state for status and stats.
func (w *standingWatch) status(now time.Time) []control.Congestion {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []control.Congestion
	for agg := maps.ClassAggPrefix; agg <= maps.ClassAggGlobal; agg++ {
		st := w.state[agg]
		c := control.Congestion{Aggregate: maps.ClassAggName(agg), Congested: !st.since.IsZero()}
		if c.Congested {
			c.Since = st.since
			c.For = control.Duration(now.Sub(st.since))
			from := maps.ClassCounters{st.start}
			c.AdmittedByClass = classShares(&from, &w.last, agg)
		}
		out = append(out, c)
	}
	return out
}

// watchStanding runs the congestion watch and the standing sweep until ctx
// ends.
func (d *Daemon) watchStanding(ctx context.Context) error {
	tick := time.NewTicker(congestionTick)
	defer tick.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			if c, err := d.m.Standing.ClassCounters(); err != nil {
				d.log.Error("read class counters", "err", err)
			} else {
				d.observeCongestion(d.standing, c, now)
			}
			d.standing.tickInstances(d.log, d.ruleSlots(), now)
			if now.Sub(lastSweep) >= standingSweep {
				lastSweep = now
				if err := d.sweepStanding(); err != nil {
					d.log.Error("sweep standing table", "err", err)
				}
			}
		}
	}
}

// sweepStanding removes entries that no longer carry anything (new sources
// gone longer than established_after, whose history would start over
// anyway; established and validated ones silent for standingRetention;
// penalties that are over) and penalises sources the deny list holds.
func (d *Daemon) sweepStanding() error {
	entries, err := d.m.Standing.All()
	if err != nil {
		return err
	}
	d.mu.Lock()
	std := d.cur.compiled.Standing
	d.mu.Unlock()
	lists, err := d.m.Lists.All()
	if err != nil {
		return err
	}
	mono, err := maps.MonoNow()
	if err != nil {
		return err
	}
	var denied []netip.Prefix
	for _, l := range lists {
		if l.DenyUntil > mono {
			denied = append(denied, l.Prefix)
		}
	}
	removed, penalised := 0, 0
	for _, e := range entries {
		idle := time.Duration(mono - min(e.LastSeenNS, mono))
		inForce := time.Duration(mono - min(e.SinceNS, mono))
		if e.Standing != maps.StandingPenalised && coveredBy(denied, e.Addr) {
			if err := d.m.Standing.SetWhy(e.Addr, maps.StandingPenalised, maps.WhyDeny); err != nil {
				return err
			}
			d.log.Debug("source penalised", "source", e.Addr, "was", maps.StandingName(e.Standing),
				"why", maps.StandingWhyName(maps.WhyDeny))
			penalised++
			continue
		}
		var drop bool
		switch e.Standing {
		case maps.StandingNew:
			drop = idle > std.EstablishedAfter
		case maps.StandingPenalised:
			drop = inForce > std.Penalty && idle > std.EstablishedAfter
		default:
			drop = idle > standingRetention
		}
		if drop {
			if err := d.m.Standing.Delete(e.Addr); err != nil {
				return err
			}
			removed++
		}
	}
	if removed+penalised > 0 {
		d.log.Debug("standing table swept", "entries", len(entries), "removed", removed, "penalised_deny_list", penalised)
	}
	return nil
}

func coveredBy(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// standingStats is the standing section of edgectl stats and status.
func (d *Daemon) standingStats() (*control.StandingStats, error) {
	c, err := d.m.Standing.ClassCounters()
	if err != nil {
		return nil, err
	}
	ev, err := d.m.Standing.Counts()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := &control.StandingStats{
		Congestion: d.standing.status(now),
		Instances:  d.standing.instanceStatus(now),
		Events: map[string]uint64{"created": ev.Created, "table_full": ev.Full,
			"established": ev.Established, "penalised": ev.Penalised, "validated_tcp": ev.Validated, "jumped": ev.Jumped},
	}
	for dry := range c {
		for agg := range c[dry] {
			for cls := range c[dry][agg] {
				for o := range c[dry][agg][cls] {
					v := c[dry][agg][cls][o]
					if v.Packets == 0 {
						continue
					}
					mode := "enforce"
					if dry == 1 {
						mode = "dry-run"
					}
					out.Classes = append(out.Classes, control.ClassStat{
						Aggregate: maps.ClassAggName(maps.ClassAgg(agg)), Class: maps.ClassName(maps.Class(cls)),
						Outcome: maps.OutcomeName(maps.Outcome(o)), Mode: mode, Packets: v.Packets, Bytes: v.Bytes,
					})
				}
			}
		}
	}
	return out, nil
}
