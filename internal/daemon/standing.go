package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
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

// standingWatch is the standing subsystem: the congestion watch (the
// class counters each congestionTick, the instances from the drop
// samples) and the standing table's sweep. It follows the committed
// generation (its standing settings, its rules' names); it writes only
// the standing table.
type standingWatch struct {
	log *slog.Logger
	// The data plane's stores, set once it is loaded: it writes standing
	// and reads the lists (the sweep) and the live rule slots.
	standing *maps.StandingStore
	lists    *maps.ListStore
	gens     *maps.Generations

	mu sync.Mutex // guards what follows; a leaf
	// gen is the generation last followed (nil before the first).
	gen   *policy.Compiled
	names map[uint32]string // its rule id -> name
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
func (w *standingWatch) observe(cur maps.ClassCounters, now time.Time) {
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
			w.log.Warn("aggregate congested: new and penalised sources are held to the budget less the reserve",
				"aggregate", name, "refused_new", refused)
		case refused > 0:
			st.lastSeen = now
		case !st.since.IsZero() && now.Sub(st.lastSeen) >= congestionCalm:
			from := maps.ClassCounters{cur[0]}
			from[0] = st.start
			w.log.Info("aggregate left congestion", "aggregate", name,
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

func newStandingWatch(log *slog.Logger) *standingWatch {
	return &standingWatch{log: log}
}

// store is the standing table; nil before the data plane loads.
func (w *standingWatch) store() *maps.StandingStore { return w.standing }

// useMaps gives the watch the loaded data plane's stores.
func (w *standingWatch) useMaps(m *maps.Maps) {
	w.standing, w.lists, w.gens = m.Standing, m.Lists, m.Generations
}

// follow takes the committed generation's standing settings and rule
// names, for the next tick and sweep. It cannot fail.
func (w *standingWatch) follow(_ context.Context, c committed) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen, w.names = c.run.compiled, c.run.names
	return nil
}

// run runs the congestion watch and the standing sweep until ctx ends.
func (w *standingWatch) run(ctx context.Context) error {
	tick := time.NewTicker(congestionTick)
	defer tick.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			if c, err := w.standing.ClassCounters(); err != nil {
				w.log.Error("read class counters", "err", err)
			} else {
				w.observe(c, now)
			}
			w.tickInstances(w.log, w.ruleSlots(), now)
			if now.Sub(lastSweep) >= standingSweep {
				lastSweep = now
				if err := w.sweep(); err != nil {
					w.log.Error("sweep standing table", "err", err)
				}
			}
		}
	}
}

// sweep removes entries that no longer carry anything (new sources
// gone longer than established_after, whose history would start over
// anyway; established and validated ones silent for standingRetention;
// penalties that are over) and penalises sources the deny list holds.
func (w *standingWatch) sweep() error {
	entries, err := w.standing.All()
	if err != nil {
		return err
	}
	w.mu.Lock()
	gen := w.gen
	w.mu.Unlock()
	if gen == nil {
		return nil // no generation followed yet
	}
	std := gen.Standing
	lists, err := w.lists.All()
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
			if err := w.standing.SetWhy(e.Addr, maps.StandingPenalised, maps.WhyDeny); err != nil {
				return err
			}
			w.log.Debug("source penalised", "source", e.Addr, "was", maps.StandingName(e.Standing),
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
			if err := w.standing.Delete(e.Addr); err != nil {
				return err
			}
			removed++
		}
	}
	if removed+penalised > 0 {
		w.log.Debug("standing table swept", "entries", len(entries), "removed", removed, "penalised_deny_list", penalised)
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
func (w *standingWatch) stats() (*control.StandingStats, error) {
	c, err := w.standing.ClassCounters()
	if err != nil {
		return nil, err
	}
	ev, err := w.standing.Counts()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := &control.StandingStats{
		Congestion: w.status(now),
		Instances:  w.instanceStatus(now),
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
