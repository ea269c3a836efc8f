package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/fleet"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// originFleet is the origin of list entries another host of the fleet
// added (docs/fleet.md).
const originFleet = "fleet"

// fleetLink is the daemon's running fleet, if any: it follows each
// committed generation (follow), runs the fleet in a goroutine of its own
// and stops it with the daemon (run). Its lock is taken after d.mu when
// both are held (publishing from AddToList), never the other way round.
type fleetLink struct {
	log *slog.Logger
	// build makes (does not run) the fleet of a section (Daemon.newFleet:
	// the client, and the daemon's lists and aggregates as its sinks).
	build func(cfg *policy.Fleet) (*fleet.Fleet, error)
	// release lets go of the data plane watches a stopped fleet held.
	release func()

	mu     sync.Mutex
	cfg    *policy.Fleet // resolved (host id filled); nil: none running
	f      *fleet.Fleet
	cancel context.CancelFunc
	done   chan struct{}
	err    string // why the configured fleet is not running
}

func newFleetLink(log *slog.Logger, build func(*policy.Fleet) (*fleet.Fleet, error), release func()) *fleetLink {
	return &fleetLink{log: log, build: build, release: release}
}

func (l *fleetLink) get() *fleet.Fleet {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f
}

// run owns the running fleet's lifetime: it stops it when the daemon
// stops. Which fleet runs is the subscriber's (follow): a committed
// generation starts, restarts or stops it.
func (l *fleetLink) run(ctx context.Context) error {
	<-ctx.Done()
	l.stop()
	return nil
}

// follow is fleet mode's subscriber (subscribers.go): a generation
// that gains a fleet: section starts it, one whose section differs from
// the running one's restarts it, one without stops it. The new fleet is
// built (client, options) before the running one stops: one that cannot
// be built leaves the running fleet as it was and says why (the policy's
// Redis credentials and TLS files are checked before the commit,
// checkFleet). A hostname that is no valid host id stops the fleet: this
// host enforces its own budgets and lists.
func (l *fleetLink) follow(_ context.Context, c committed) error {
	var want *policy.Fleet
	if c.run.pol.Fleet != nil {
		cp := *c.run.pol.Fleet
		want = &cp
	}
	if want != nil && want.HostID == "" {
		h, err := os.Hostname()
		if err != nil || !policy.ValidHostID(h) {
			l.stop()
			why := fmt.Errorf("hostname %q is no valid fleet host id (%v): set fleet.host_id; this host enforces its own budgets and lists", h, err)
			l.mu.Lock()
			l.err = why.Error()
			l.mu.Unlock()
			return why
		}
		want.HostID = h
	}
	l.mu.Lock()
	same := reflect.DeepEqual(l.cfg, want)
	l.mu.Unlock()
	if same {
		return nil
	}
	if want == nil {
		l.stop()
		return nil
	}
	f, err := l.build(want)
	if err != nil {
		l.mu.Lock()
		running := l.f != nil
		l.err = err.Error()
		l.mu.Unlock()
		if running {
			return fmt.Errorf("fleet not restarted, the running fleet keeps its earlier section: %w", err)
		}
		return fmt.Errorf("fleet not started: this host enforces its own budgets and lists: %w", err)
	}
	l.stop()
	l.start(want, f)
	return nil
}

// newFleet builds (does not run) the fleet of a fleet: section.
func (d *Daemon) newFleet(cfg *policy.Fleet) (*fleet.Fleet, error) {
	c, err := fleet.NewClient(cfg.Redis)
	if err != nil {
		return nil, err
	}
	o := fleet.Options{Name: cfg.Name, Host: cfg.HostID, Interval: cfg.Interval, Floor: float64(cfg.Floor) / 1e6,
		Client: c, Logger: d.log.With("fleet", cfg.Name, "host", cfg.HostID)}
	if cfg.Lists {
		o.Lists = fleetLists{d}
	}
	d.fleetAggregates(&o)
	f, err := fleet.New(o)
	if err != nil {
		c.Close()
		return nil, err
	}
	return f, nil
}

// start runs a built fleet until stop.
func (l *fleetLink) start(cfg *policy.Fleet, f *fleet.Fleet) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fctx, cancel := context.WithCancel(context.Background())
	l.cfg, l.f, l.cancel, l.done, l.err = cfg, f, cancel, make(chan struct{}), ""
	go func(done chan struct{}) {
		defer close(done)
		f.Run(fctx)
	}(l.done)
	l.log.Info("fleet started", "fleet", cfg.Name, "host", cfg.HostID, "interval", cfg.Interval, "redis", cfg.Redis.Addrs,
		"cluster", cfg.Redis.Cluster, "lists", cfg.Lists)
}

// stop stops the running fleet (waiting for its goroutine) and lets go
// of its watches.
func (l *fleetLink) stop() {
	l.mu.Lock()
	cancel, done, was := l.cancel, l.done, l.cfg
	l.f, l.cancel, l.done, l.cfg, l.err = nil, nil, nil, nil, ""
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if was != nil {
		l.log.Info("fleet stopped", "fleet", was.Name)
	}
	l.release()
}

// unwatchFleet lets go of fleet mode's watches not in want (the shield
// may keep them: maps' Overrides.Unwatch).
func (d *Daemon) unwatchFleet(want map[watchKey]fleetBudget) error {
	if d.m == nil {
		return nil // no data plane
	}
	var errs []error
	for w := range d.m.Overrides.WatchedBy(maps.OriginFleet) {
		if _, ok := want[watchKey{w.RuleID, w.Kind}]; ok {
			continue
		}
		if err := d.m.Overrides.Unwatch(w.RuleID, w.Kind, maps.OriginFleet); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkFleet refuses a fleet: section whose Redis credentials or TLS files
// cannot be read (the client is built, nothing is dialled): like an
// unreadable list file, the policy is refused and the running one stays.
func checkFleet(p *policy.Policy) error {
	if p.Fleet == nil {
		return nil
	}
	c, err := fleet.NewClient(p.Fleet.Redis)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	return c.Close()
}

// FleetStatus is `edgectl fleet status`.
func (d *Daemon) FleetStatus() control.FleetStatus {
	l := d.fleet
	l.mu.Lock()
	f, cfg, why := l.f, l.cfg, l.err
	l.mu.Unlock()
	if f == nil {
		st := control.FleetStatus{LastError: why}
		if cfg != nil {
			st.Name, st.Host = cfg.Name, cfg.HostID
		}
		return st
	}
	st := f.Status()
	if st.LastError == "" && why != "" {
		st.LastError = why // a changed section the running fleet could not follow
	}
	names := d.ruleNames()
	for i, sh := range st.Shares {
		st.Shares[i].Key = sh.Aggregate
		st.Shares[i].Aggregate = namedAggregate(sh.Aggregate, names)
	}
	return st
}

// namedAggregate is a fleet aggregate key ("rule 3524799594 whole", the
// form every host shares in Redis) with the rule's name for the operator
// ("rule bots whole").
func namedAggregate(key string, names map[uint32]string) string {
	rest, ok := strings.CutPrefix(key, "rule ")
	if !ok {
		return key
	}
	idText, tail, _ := strings.Cut(rest, " ")
	id, err := strconv.ParseUint(idText, 10, 32)
	if err != nil || names[uint32(id)] == "" {
		return key
	}
	return strings.TrimSpace("rule " + names[uint32(id)] + " " + tail)
}

func (d *Daemon) fleetRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/fleet", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, d.FleetStatus())
	})
}

// publishList hands a local list change to the fleet (never blocks).
// Caller may hold d.mu.
func (l *fleetLink) publishList(op fleet.Op, kind control.ListKind, p netip.Prefix, e dynEntry) {
	f := l.get()
	if f == nil {
		return
	}
	origin := e.origin
	if op == fleet.OpAdd && origin == originFleet {
		return // another host's: it published it
	}
	if origin == originFleet || origin == "" {
		origin = "cli"
	}
	f.Publish(fleet.ListEntry{Op: op, List: string(kind), Prefix: p, Expires: e.expires, Origin: origin,
		Reason: fleet.CleanReason(e.reason)})
}

// fleetLists is the daemon as the fleet's ListSink.
type fleetLists struct{ d *Daemon }

// ApplyRemote applies other hosts' entries through the same checks as
// the CLI's without --force (width, lists.protected for deny), all in one
// write of the lists; a failed write changes nothing. A snapshot
// (replace) never overwrites this host's own entries (its reconcile
// publishes them next); a live change from the stream does (last writer
// wins), and a removal removes the prefix whatever its origin (the fleet
// shares one list).
func (s fleetLists) ApplyRemote(entries []fleet.ListEntry, replace bool) (int, []fleet.Refusal, error) {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	prev := map[control.ListKind]map[netip.Prefix]dynEntry{}
	for k, m := range d.lists.dyn {
		prev[k] = make(map[netip.Prefix]dynEntry, len(m))
		for p, e := range m {
			prev[k][p] = e
		}
	}
	if replace {
		for _, m := range d.lists.dyn {
			for p, e := range m {
				if e.origin == originFleet {
					delete(m, p)
				}
			}
		}
	}
	var refused []fleet.Refusal
	for _, e := range entries {
		kind := control.ListKind(e.List)
		m, ok := d.lists.dyn[kind]
		if !ok {
			refused = append(refused, fleet.Refusal{Entry: e, Err: fmt.Errorf("unknown list %q", e.List)})
			continue
		}
		p := e.Prefix.Masked()
		if e.Op == fleet.OpDel {
			delete(m, p)
			continue
		}
		if err := checkWidth(kind, p); err != nil {
			refused = append(refused, fleet.Refusal{Entry: e, Err: err})
			continue
		}
		if kind == control.Deny {
			if err := d.checkProtected(p); err != nil {
				refused = append(refused, fleet.Refusal{Entry: e, Err: err})
				continue
			}
		}
		if cur, ok := m[p]; ok && replace && cur.origin != originFleet {
			continue
		}
		m[p] = dynEntry{expires: e.Expires, origin: originFleet, host: e.Host, reason: e.Origin + ": " + e.Reason}
	}
	if err := d.lists.sync(d.cur.pol); err != nil {
		d.lists.dyn = prev
		return 0, nil, err
	}
	if err := d.lists.save(); err != nil {
		d.log.Error("fleet list entries applied but not saved: a restart loads them from the fleet again", "err", err)
	}
	n := 0
	for _, m := range d.lists.dyn {
		for _, e := range m {
			if e.origin == originFleet {
				n++
			}
		}
	}
	return n, refused, nil
}

// Local is this host's own run-time entries.
func (s fleetLists) Local() []fleet.ListEntry {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	var out []fleet.ListEntry
	for kind, m := range d.lists.dyn {
		for p, e := range m {
			if e.origin == originFleet || (!e.expires.IsZero() && !e.expires.After(now)) {
				continue
			}
			origin := e.origin
			if origin != "l7" && origin != "shield" {
				origin = "cli"
			}
			out = append(out, fleet.ListEntry{Op: fleet.OpAdd, List: string(kind), Prefix: p, Expires: e.expires,
				Origin: origin, Reason: fleet.CleanReason(e.reason)})
		}
	}
	return out
}

// fleetCollector exports the running fleet's metrics (none without one).
// It describes nothing: the families come and go with the fleet: section.
type fleetCollector struct{ d *Daemon }

func (c fleetCollector) Describe(chan<- *prometheus.Desc) {}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	if f := c.d.fleet.get(); f != nil {
		f.Collector().Collect(ch)
	}
}

// fleetAggregates gives the fleet the data plane's scope: fleet
// aggregates.
func (d *Daemon) fleetAggregates(o *fleet.Options) {
	o.Aggregates = &fleetAggs{d: d}
}

type watchKey struct {
	rule uint32
	kind maps.AggKind
}

// fleetBudget is one scope: fleet rule's shared budget of one aggregate
// kind: packets (rate) and bytes (Count bytes per Per, Burst bytes);
// either may be unset (zero Count).
type fleetBudget struct {
	rate, bytes maps.Rate
}

// perSecond is a budget per second (0 unset).
func perSecond(r maps.Rate) float64 {
	if r.Per <= 0 || !r.Limited() {
		return 0
	}
	return float64(r.Count) / r.Per.Seconds()
}

// scaleRate is r times f (clamped to [0, 1]; NaN is 1), rounded up, at
// least one unit of rate and minBurst (capped at r's burst) of burst,
// never above r; unset stays unset.
func scaleRate(r maps.Rate, f float64, minBurst uint64) maps.Rate {
	if !r.Limited() {
		return maps.Rate{}
	}
	if math.IsNaN(f) {
		f = 1 // a broken share: the policy's budget, as without fleet mode
	}
	f = min(max(f, 0), 1)
	return maps.Rate{Count: max(1, scaleUp(r.Count, f)), Per: r.Per, Burst: max(min(minBurst, r.Burst), scaleUp(r.Burst, f))}
}

// scaleUp is ⌈n·f⌉ for 0 <= f <= 1, never above n (float64 rounds n up
// near 2^64, where converting back would not be exact).
func scaleUp(n uint64, f float64) uint64 {
	v := math.Ceil(float64(n) * f)
	if v >= float64(n) {
		return n
	}
	return uint64(v)
}

// scaled is the share the data plane enforces: the packet budget times
// pf and the byte budget times bf, rounded up, at least one packet of
// rate and burst, one byte/s and one 1,500-byte packet of burst (or the
// policy's burst if smaller): a share never refuses every full-size
// packet.
func (b fleetBudget) scaled(pf, bf float64) (pkts, bytes maps.Rate) {
	return scaleRate(b.rate, pf, 1), scaleRate(b.bytes, bf, 1500)
}

// fleetAggs is the daemon as the fleet's Aggregates: the data plane counts
// every instance of each scope: fleet rule's aggregates (maps.
// Overrides.Watch), and shares are written as overrides of origin fleet.
type fleetAggs struct {
	d *Daemon
	// The fleet's shares loop is the only caller of both methods, one
	// call at a time: what follows needs no lock.
	aggs    map[string]maps.Aggregate
	budgets map[watchKey]fleetBudget
}

// fleetBudgets are the running policy's scope: fleet budgets: per_asn for
// ASN aggregates, per_prefix for whole or derived prefix aggregates, both
// dimensions (packets and bytes; docs/fleet.md).
func fleetBudgets(p *policy.Policy) map[watchKey]fleetBudget {
	out := map[watchKey]fleetBudget{}
	if p == nil {
		return out
	}
	for _, r := range p.Rules {
		if r.Scope != policy.ScopeFleet || r.Action != policy.ActionLimit {
			continue
		}
		id := policy.RuleID(r.Name)
		if b := r.Limits.PerASN; b.IsSet() {
			out[watchKey{id, maps.AggKindASN}] = fleetBudgetOf(b)
		}
		if b := r.Limits.PerPrefix; b.IsSet() {
			kind := maps.AggKindPrefix
			if b.Whole {
				kind = maps.AggKindWhole
			}
			out[watchKey{id, kind}] = fleetBudgetOf(b.Bucket)
		}
	}
	return out
}

func fleetBudgetOf(b policy.Bucket) fleetBudget {
	var fb fleetBudget
	if l := b.Packets; l.IsSet() {
		fb.rate = maps.Rate{Count: l.Rate.Count, Per: l.Rate.Per, Burst: l.Burst}
	}
	if l := b.Bytes; l.IsSet() {
		fb.bytes = maps.Rate{Count: l.Rate.Count, Per: l.Rate.Per, Burst: l.Burst}
	}
	return fb
}

// FleetCounters makes sure every scope: fleet (rule, kind) is watched,
// lets go of fleet mode's other watches (the shield may hold the same
// ones: maps' Overrides.Unwatch), and returns their instances' counters.
// What is watched is the data plane's record (maps.WatchedBy): a rule
// removed and re-added between two calls is watched again.
func (a *fleetAggs) FleetCounters() ([]fleet.AggCounter, error) {
	a.d.mu.Lock()
	budgets := fleetBudgets(a.d.cur.pol)
	a.d.mu.Unlock()
	a.budgets = budgets
	have := a.d.m.Overrides.WatchedBy(maps.OriginFleet)
	for k := range budgets {
		if have[maps.Watch{RuleID: k.rule, Kind: k.kind}] {
			continue
		}
		if err := a.d.m.Overrides.Watch(k.rule, k.kind, maps.OriginFleet); err != nil {
			return nil, fmt.Errorf("watch rule %d aggregates: %w", k.rule, err)
		}
	}
	if err := a.d.unwatchFleet(budgets); err != nil {
		return nil, err
	}
	cs, err := a.d.m.Overrides.AggregateCounters()
	if err != nil {
		return nil, err
	}
	a.aggs = map[string]maps.Aggregate{}
	var out []fleet.AggCounter
	for _, c := range cs {
		b, ok := budgets[watchKey{c.Aggregate.RuleID, c.Aggregate.Kind}]
		if !ok {
			continue
		}
		key := c.Aggregate.String()
		a.aggs[key] = c.Aggregate
		out = append(out, fleet.AggCounter{Key: key, Passed: c.Passed.Packets, Dropped: c.Dropped.Packets,
			PassedBytes: c.Passed.Bytes, DroppedBytes: c.Dropped.Bytes, Budget: perSecond(b.rate), ByteBudget: perSecond(b.bytes)})
	}
	return out, nil
}

// ApplyShares writes each share as an override of the aggregate's budget
// (both dimensions the rule has, each scaled by its share), in force
// until expires.
func (a *fleetAggs) ApplyShares(shares []fleet.Share, expires time.Time) error {
	var list []maps.Override
	for _, s := range shares {
		agg, ok := a.aggs[s.Key]
		if !ok {
			continue
		}
		b, ok := a.budgets[watchKey{agg.RuleID, agg.Kind}]
		if !ok {
			continue
		}
		pkts, bytes := b.scaled(s.Fraction(), s.ByteFraction())
		list = append(list, maps.Override{Aggregate: agg, Budget: pkts, Bytes: bytes, Expires: expires, Origin: maps.OriginFleet})
	}
	if len(list) == 0 {
		return nil
	}
	if err := a.d.m.Overrides.SetMany(list); err != nil {
		// One bad entry (its rule just went in a reload) must not cost
		// the others: write them one by one.
		var failed int
		var first error
		for _, o := range list {
			if err := a.d.m.Overrides.Set(o); err != nil {
				failed++
				first = cmp.Or(first, err)
			}
		}
		if failed > 0 {
			return fmt.Errorf("%d of %d shares not written: %w", failed, len(list), first)
		}
	}
	return nil
}
