package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// The adaptive shield as the daemon runs it (docs/shield.md): samples from
// the ring buffer go to the engine, which learns and decides once per
// interval; its changes are written to the data plane (enforce), logged,
// appended to the audit file and counted; its baselines are saved in the
// state directory.
const (
	shieldStateFile = "shield-baselines.json"
	shieldAuditFile = "shield-audit.jsonl"
	// shieldAuditMax is the audit file's size before it is rotated to
	// FILE.1 (one generation kept).
	shieldAuditMax  = 16 << 20
	shieldSaveEvery = time.Minute
)

// shieldRun is the daemon's side of the shield: it owns the engine, its
// loop (run), its data plane writes, audit and state files, and follows
// each committed generation (follow).
type shieldRun struct {
	log       *slog.Logger
	m         *maps.Maps                                                 // set when the data plane is loaded
	statePath func(name string) string                                   // "" without a state directory
	readState func(name string, decode func([]byte) error) (bool, error) // Daemon.readStateFile
	// onChange is told of each change written to the data plane (the
	// BGP speaker announces fingerprints as FlowSpec rules).
	onChange func(shield.Change)

	in chan shield.Sample // from sampleRings.readRates; full: the sample is dropped and counted

	// turn serializes the engine's two writers of the data plane: the
	// interval's close (tick, the shield's loop) and a generation's
	// configuration (follow, the apply path), so a reconfiguration's
	// changes and an interval's are never interleaved. Taken before mu.
	turn sync.Mutex

	mu        sync.Mutex // guards what follows
	eng       *shield.Engine
	cfg       policy.Shield
	gen       uint64            // policy generation configured from
	slotToID  map[uint32]uint32 // rule table slot -> rule id
	asn       *asn.Table
	counts    aggCounts // last aggregate counter reading (the loop's)
	lastPrune time.Time

	dropped, failed atomic.Uint64
	noSlot          atomic.Uint64 // fingerprints not installed for lack of a mask slot
	auditMu         sync.Mutex
	mitigate        prometheus.Histogram
}

func newShieldRun(log *slog.Logger, statePath func(string) string, readState func(string, func([]byte) error) (bool, error),
	onChange func(shield.Change)) *shieldRun {
	return &shieldRun{
		log: log, statePath: statePath, readState: readState, onChange: onChange,
		in: make(chan shield.Sample, 8192),
		mitigate: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeguard_shield_time_to_mitigate_seconds",
			Help:    "From a surge's start (its rate above factor x baseline) to its action in the data plane (mode enforce).",
			Buckets: []float64{0.5, 1, 2, 3, 5, 8, 13, 21, 34, 60},
		}),
	}
}

// shieldConfig is the policy's shield: section as the engine takes it;
// a policy without one runs the shield off (the section's defaults,
// mode off).
func shieldConfig(s *policy.Shield) policy.Shield {
	if s == nil {
		c := policy.DefaultShield()
		c.Mode = policy.ShieldOff
		return c
	}
	return *s
}

// shieldOptions are what the shield needs to know of the data plane.
func shieldOptions() shield.Options { return shield.Options{MaxMasks: maps.MaxFingerprintMasks} }

// ruleShapes say per rule what an override can tighten.
func ruleShapes(c *policy.Compiled) map[uint32]shield.RuleShape {
	out := map[uint32]shield.RuleShape{}
	for _, r := range c.Rules {
		s := shield.RuleShape{ASN: r.PerASN.IsSet()}
		if r.PerPrefix.IsSet() {
			switch r.Aggregate {
			case policy.AggregateWhole:
				s.Whole = true
			case policy.AggregateDerived:
				s.PrefixLen4, s.PrefixLen6 = r.AggregateKey.V4, r.AggregateKey.V6
			}
		}
		out[r.ID] = s
	}
	return out
}

// run is the shield's loop.
func (st *shieldRun) run(ctx context.Context) error {
	interval := time.Second
	t := time.NewTicker(interval)
	defer t.Stop()
	lastSave := time.Now()
	defer st.save()
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-st.in:
			st.mu.Lock()
			eng := st.eng
			st.mu.Unlock()
			if eng != nil {
				eng.Observe(s)
			}
		case now := <-t.C:
			if iv := st.tick(now); iv > 0 && iv != interval {
				interval = iv
				t.Reset(iv)
			}
			if time.Since(lastSave) >= shieldSaveEvery {
				st.save()
				lastSave = time.Now()
			}
		}
	}
}

// follow is the shield's subscriber (subscribers.go): it configures
// the engine for a committed generation and writes what that changes. A
// rule slot table that does not read leaves samples unattributed until
// the next generation (said in the error); the engine follows anyway.
func (st *shieldRun) follow(_ context.Context, c committed) error {
	st.turn.Lock()
	defer st.turn.Unlock()
	changes, err := st.configure(c.seq, c.run.pol, c.run.compiled, c.run.asn, c.at)
	st.mu.Lock()
	eng := st.eng
	st.mu.Unlock()
	for _, ch := range changes {
		st.change(eng, ch)
	}
	return err
}

// tick closes the engine's interval and writes its changes. It
// returns the configured interval (0 before the first generation).
func (st *shieldRun) tick(now time.Time) time.Duration {
	st.turn.Lock()
	defer st.turn.Unlock()
	st.mu.Lock()
	eng, iv, gen := st.eng, st.cfg.Interval, st.gen
	st.mu.Unlock()
	if gen == 0 {
		return 0
	}
	var changes []shield.Change
	if eng != nil {
		// Samples that arrived before the interval's end belong to it.
	drain:
		for {
			select {
			case s := <-st.in:
				eng.Observe(s)
			default:
				break drain
			}
		}
		st.count(eng)
		changes = append(changes, eng.Tick(now)...)
		for _, n := range eng.TakeNoSlots() {
			st.noSlot.Add(1)
			st.log.Warn("shield: fingerprint not installed: every mask slot of the data plane is taken by the shield's other fingerprints",
				"aggregate", n.Key.String(), "fingerprint", n.Fingerprint.String(), "masks", n.Masks,
				"max_masks", maps.MaxFingerprintMasks)
		}
	}
	if now.Sub(st.lastPrune) >= 10*time.Second {
		st.lastPrune = now
		if n, err := st.m.Overrides.Prune(); err != nil {
			st.log.Warn("shield: prune expired overrides", "err", err)
		} else if n > 0 {
			st.log.Info("shield: expired overrides pruned", "count", n)
		}
		if n, err := st.m.Fingerprints.Prune(); err != nil {
			st.log.Warn("shield: prune expired fingerprints", "err", err)
		} else if n > 0 {
			st.log.Info("shield: expired fingerprints pruned", "count", n)
		}
	}
	for _, c := range changes {
		st.change(eng, c)
	}
	return iv
}

// configure applies a policy generation's shield: section. Caller
// holds st.turn.
func (st *shieldRun) configure(gen uint64, pol *policy.Policy, comp *policy.Compiled, table *asn.Table, now time.Time) ([]shield.Change, error) {
	cfg := shieldConfig(pol.Shield)
	slots := map[uint32]uint32{}
	byID, slotErr := st.m.Generations.RuleSlots()
	if slotErr != nil {
		slotErr = fmt.Errorf("read rule slots: samples are not attributed to rules until the next policy: %w", slotErr)
	}
	for id, slot := range byID {
		slots[slot] = id
	}
	var shapes map[uint32]shield.RuleShape
	var global shield.GlobalShape
	if cfg.Mode != shield.ModeOff {
		shapes, global = st.watch(comp)
	} else {
		st.watch(nil)
	}
	var load []byte
	var topID uint32
	if st.eng == nil && cfg.Mode != shield.ModeOff {
		if _, err := st.readState(shieldStateFile, func(b []byte) error { load = b; return nil }); err != nil {
			st.log.Error("shield: read saved baselines; learning from scratch", "err", err)
		}
		// Fingerprints in the pinned maps (a crashed daemon's, until
		// they expire) keep their ids and counters: new ones are
		// numbered above them.
		var err error
		if topID, err = st.m.Fingerprints.MaxID(); err != nil {
			st.log.Error("shield: read the data plane's fingerprint ids; a new one may replace an older one", "err", err)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.gen, st.slotToID, st.asn = gen, slots, table
	prev := st.cfg.Mode
	st.cfg = cfg
	var out []shield.Change
	switch {
	case st.eng == nil && cfg.Mode != shield.ModeOff:
		st.eng = shield.New(cfg, shieldOptions())
		if topID > 0 {
			st.eng.SeedIDs(topID)
			st.log.Info("shield: fingerprint ids continue above the data plane's", "max_id", topID)
		}
		st.eng.SetRules(shapes, global)
		st.eng.SetASNOf(asnOfPrefix(table))
		st.adopt(st.eng, now)
		if load != nil {
			if n, err := st.eng.Load(load, now); err != nil {
				st.quarantine(shieldStateFile, err)
			} else if n > 0 {
				st.log.Info("shield: restored learned baselines", "aggregates", n, "file", st.statePath(shieldStateFile))
			}
		}
		st.eng.Tick(now)
	case st.eng != nil:
		if cfg.Mode != shield.ModeOff {
			st.eng.SetRules(shapes, global)
		}
		st.eng.SetASNOf(asnOfPrefix(table))
		out = st.eng.Reconfigure(cfg, now)
	}
	if cfg.Mode == shield.ModeOff && st.eng == nil && gen == 1 {
		st.leftovers(now)
	}
	if prev != cfg.Mode || gen == 1 {
		st.log.Info("shield", "mode", cfg.Mode, "interval", cfg.Interval, "learn_for", cfg.LearnFor, "factor", cfg.Factor)
	}
	return out, slotErr
}

// quarantine moves a state file that does not load aside as
// FILE.corrupt, as readStateFile does for one that does not parse.
func (st *shieldRun) quarantine(name string, err error) {
	path := st.statePath(name)
	aside := path + ".corrupt"
	if rerr := os.Rename(path, aside); rerr != nil {
		st.log.Error("state file does not load and could not be moved aside", "file", path, "err", err, "rename_err", rerr)
		return
	}
	st.log.Error("state file does not load: moved aside, starting without it", "file", path, "moved_to", aside, "err", err)
}

// actions are the shield's actions in force (nil: it is off).
func (st *shieldRun) actions() []shield.Action {
	st.mu.Lock()
	eng := st.eng
	st.mu.Unlock()
	if eng == nil {
		return nil
	}
	return eng.Report(1).Actions
}

// save writes the learned baselines (atomically).
func (st *shieldRun) save() {
	st.mu.Lock()
	eng := st.eng
	st.mu.Unlock()
	path := st.statePath(shieldStateFile)
	if eng == nil || path == "" {
		return
	}
	data, err := eng.Save(time.Now())
	if err == nil {
		err = writeFileAtomic(path, data, 0o600)
	}
	if err != nil {
		st.log.Error("shield: save baselines", "err", err)
	}
}

// sample hands a ring-buffer sample to the shield; it never blocks
// the reader.
func (st *shieldRun) sample(s maps.Sample) {
	st.mu.Lock()
	on := st.eng != nil && st.cfg.Mode != shield.ModeOff
	var smp shield.Sample
	var ok bool
	if on {
		smp, ok = toShieldSample(s, st.slotToID, st.asn)
	}
	st.mu.Unlock()
	if !ok {
		return
	}
	select {
	case st.in <- smp:
	default:
		st.dropped.Add(1)
	}
}

// change writes one change to the data plane (enforced actions
// only), logs it and appends it to the audit file.
func (st *shieldRun) change(eng *shield.Engine, c shield.Change) {
	a := c.Action
	var err error
	if a.Enforced {
		err = st.write(c)
		if err != nil {
			st.failed.Add(1)
			if eng != nil && c.Op != shield.OpRemove {
				eng.Failed(a.ID)
			}
		} else if c.Op == shield.OpInstall && c.Mitigate > 0 {
			st.mitigate.Observe(c.Mitigate.Seconds())
		}
	}
	attrs := []any{"op", c.Op, "id", a.ID, "kind", a.Kind, "aggregate", a.Key.String(), "enforced", a.Enforced,
		"budget_pps", int64(a.Budget), "baseline_pps", int64(a.Baseline), "rate_pps", int64(a.Rate), "why", c.Why, "by", c.By}
	if a.Fingerprint != nil {
		attrs = append(attrs, "fingerprint", a.Fingerprint.String())
	}
	switch {
	case err != nil:
		st.log.Error("shield action not written to the data plane", append(attrs, "err", err)...)
	case c.Op == shield.OpRenew:
		st.log.Debug("shield action", attrs...)
	case a.Enforced:
		st.log.Info("shield action", attrs...)
	default:
		st.log.Info("shield action (monitor: not enforced)", attrs...)
	}
	if c.Op != shield.OpRenew {
		st.audit(c, err)
	}
	if err == nil {
		st.onChange(c)
	}
}

// auditRecord is one line of the shield's audit file.
type auditRecord struct {
	Time        time.Time `json:"time"`
	Op          string    `json:"op"`
	ID          uint32    `json:"id"`
	Kind        string    `json:"kind"`
	Aggregate   string    `json:"aggregate"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	BudgetPPS   float64   `json:"budget_pps"`
	BaselinePPS float64   `json:"baseline_pps"`
	RatePPS     float64   `json:"rate_pps"`
	Enforced    bool      `json:"enforced"`
	Why         string    `json:"why"`
	By          string    `json:"by"`
	Expires     time.Time `json:"expires,omitzero"`
	Error       string    `json:"error,omitempty"`
}

// audit appends a change to STATE_DIR/shield-audit.jsonl.
func (st *shieldRun) audit(c shield.Change, werr error) {
	path := st.statePath(shieldAuditFile)
	if path == "" {
		return
	}
	a := c.Action
	rec := auditRecord{Time: c.At.UTC(), Op: string(c.Op), ID: a.ID, Kind: string(a.Kind), Aggregate: a.Key.String(),
		BudgetPPS: a.Budget, BaselinePPS: a.Baseline, RatePPS: a.Rate, Enforced: a.Enforced, Why: c.Why, By: c.By}
	if a.Fingerprint != nil {
		rec.Fingerprint = a.Fingerprint.String()
	}
	if c.Op != shield.OpRemove {
		rec.Expires = a.Expires.UTC()
	}
	if werr != nil {
		rec.Error = werr.Error()
	}
	rotErr, err := appendAudit(&st.auditMu, path, shieldAuditMax, rec)
	if rotErr != nil {
		st.log.Error("shield: rotate the audit file", "err", rotErr)
	}
	if err != nil {
		st.log.Error("shield: append to the audit file", "file", path, "err", err)
	}
}

// shieldRoutes adds the shield's endpoints to the control API.
func (d *Daemon) shieldRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/shield", func(w http.ResponseWriter, r *http.Request) {
		n := 20
		if s := r.URL.Query().Get("n"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v <= 0 || v > 100000 {
				writeError(w, http.StatusBadRequest, fmt.Errorf("bad n %q: use a number from 1 to 100000", s))
				return
			}
			n = v
		}
		writeJSON(w, d.ShieldReport(n))
	})
	for _, verb := range []string{"release", "pin", "forbid"} {
		mux.Handle("POST /v1/shield/"+verb, d.rootOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req control.ShieldRequest
			if !decodeBody(w, r, maxSmallBody, "shield request", &req) {
				return
			}
			uid, _ := r.Context().Value(peerUIDKey{}).(int)
			by := fmt.Sprintf("uid %d", uid)
			if req.By != "" {
				by = fmt.Sprintf("%.64s (uid %d)", req.By, uid)
			}
			if err := d.ShieldDo(verb, req, by); err != nil {
				status := http.StatusUnprocessableEntity
				if errors.Is(err, shield.ErrNoAction) {
					status = http.StatusNotFound
				}
				writeError(w, status, err)
				return
			}
			writeJSON(w, d.ShieldReport(20))
		})))
	}
}

var errShieldOff = errors.New("the shield is off: the policy has no shield: section or mode: off")

// ShieldDo releases or pins an action, or forbids an aggregate.
func (d *Daemon) ShieldDo(verb string, req control.ShieldRequest, by string) error {
	st := d.shield
	st.mu.Lock()
	eng := st.eng
	st.mu.Unlock()
	if eng == nil {
		return errShieldOff
	}
	now := time.Now()
	switch verb {
	case "release":
		c, err := eng.Release(req.ID, by, now)
		if err != nil {
			return err
		}
		d.shield.change(eng, c)
	case "pin":
		a, err := eng.Pin(req.ID, by)
		if err != nil {
			return err
		}
		d.log.Info("shield action pinned", "id", a.ID, "aggregate", a.Key.String(), "by", by)
		d.shield.audit(shield.Change{Op: "pin", Action: a, Why: "pinned by " + by, By: by, At: now}, nil)
	case "forbid":
		f, err := shield.ParseForbid(req.Aggregate)
		if err != nil {
			return err
		}
		f.By = by
		if req.Remove {
			if !eng.RemoveForbid(f) {
				return fmt.Errorf("%s is not forbidden by an operator (forbids in the policy's shield.forbid stay)", f)
			}
			d.log.Info("shield forbid lifted", "aggregate", f.String(), "by", by)
		} else {
			for _, c := range eng.AddForbid(f, now) {
				d.shield.change(eng, c)
			}
			d.log.Info("shield forbid", "aggregate", f.String(), "by", by)
		}
		d.shield.save()
	default:
		return fmt.Errorf("unknown shield request %q", verb)
	}
	return nil
}

// ShieldReport is the answer of edgectl shield.
func (d *Daemon) ShieldReport(n int) control.ShieldReport {
	st := d.shield
	st.mu.Lock()
	eng, mode := st.eng, st.cfg.Mode
	st.mu.Unlock()
	out := control.ShieldReport{Mode: string(mode), Aggregates: []control.ShieldAggregate{}, Actions: []control.ShieldAction{}, Forbid: []string{}}
	if out.Mode == "" {
		out.Mode = string(shield.ModeOff)
	}
	if eng == nil {
		return out
	}
	r := eng.Report(n)
	out.Tracked, out.Capacity, out.Surges, out.WouldDrop = r.Tracked, r.Capacity, r.Surges, r.WouldDrop
	names := d.ruleNames()
	for _, row := range r.Rows {
		out.Aggregates = append(out.Aggregates, control.ShieldAggregate{
			Aggregate: aggName(row.Key, names), Baseline: row.Baseline, BaselineBits: row.BaselineBits,
			Rate: row.Rate, Bits: row.Bits, Factor: row.Factor, State: row.State.String(),
			Learned: control.Duration(row.Learned.Round(time.Second)), Judged: row.Judged, LearningPaused: row.LearningPaused, Action: row.Action,
		})
	}
	for _, a := range r.Actions {
		out.Actions = append(out.Actions, shieldAction(a, names))
	}
	for _, f := range r.Forbid {
		s := f.String()
		if f.By != "" {
			s += " (" + f.By + ")"
		}
		out.Forbid = append(out.Forbid, s)
	}
	return out
}

// aggName is the key with the rule's name: "rule 3 (partners) asn 64500".
func aggName(k shield.Key, names map[uint32]string) string {
	s := k.String()
	switch k.Kind {
	case shield.KindPrefix, shield.KindASN, shield.KindRule:
		if n, ok := names[k.Rule]; ok {
			pre := "rule " + strconv.FormatUint(uint64(k.Rule), 10)
			s = pre + " (" + n + ")" + s[len(pre):]
		}
	}
	return s
}

func shieldAction(a shield.Action, names map[uint32]string) control.ShieldAction {
	out := control.ShieldAction{ID: a.ID, Kind: string(a.Kind), Aggregate: aggName(a.Key, names), Budget: a.Budget,
		Baseline: a.Baseline, Rate: a.Rate, Coverage: a.Coverage, Collateral: a.Collateral, Reason: a.Reason,
		Since: a.Since, Expires: a.Expires, Pinned: a.Pinned, PinnedBy: a.PinnedBy, Enforced: a.Enforced, Adopted: a.Adopted}
	if a.Fingerprint != nil {
		out.Fingerprint = a.Fingerprint.String()
		if a.Adopted && a.Key == (shield.Key{}) {
			out.Aggregate = "unknown (adopted: the data plane does not record it)"
		}
	}
	return out
}

// shieldCollector exports the shield's metrics.
type shieldCollector struct {
	d                         *Daemon
	active, would, tracked    *prometheus.Desc
	surges, wouldDrop         *prometheus.Desc
	samplesDropped, writeFail *prometheus.Desc
	noSlot                    *prometheus.Desc
}

func newShieldCollector(d *Daemon) []prometheus.Collector {
	return []prometheus.Collector{&shieldCollector{
		d: d,
		active: prometheus.NewDesc("edgeguard_shield_actions_active",
			"Shield actions in force in the data plane, by kind (tighten, fingerprint).", []string{"kind"}, nil),
		would: prometheus.NewDesc("edgeguard_shield_actions_would",
			"Shield actions decided in mode monitor (not written to the data plane), by kind.", []string{"kind"}, nil),
		tracked: prometheus.NewDesc("edgeguard_shield_aggregates_tracked",
			"Aggregates the shield keeps a baseline for (at most shield.baseline.max_aggregates).", nil, nil),
		surges: prometheus.NewDesc("edgeguard_shield_surges_total",
			"Aggregates that entered a confirmed surge (above factor x baseline and min_rate for sustain).", nil, nil),
		wouldDrop: prometheus.NewDesc("edgeguard_shield_would_drop_packets_total",
			"Packets mode monitor's actions would have dropped: estimated, the aggregate's rate above the action's budget.", nil, nil),
		samplesDropped: prometheus.NewDesc("edgeguard_shield_samples_dropped_total",
			"Samples the shield did not see because its queue was full.", nil, nil),
		writeFail: prometheus.NewDesc("edgeguard_shield_write_failures_total",
			"Shield changes the data plane refused (retried next interval).", nil, nil),
		noSlot: prometheus.NewDesc("edgeguard_shield_fingerprints_no_slot_total",
			"Surges whose fingerprint the shield did not install: every data-plane mask slot was taken by its other fingerprints.", nil, nil),
	}, d.shield.mitigate}
}

func (c *shieldCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.active, c.would, c.tracked, c.surges, c.wouldDrop, c.samplesDropped, c.writeFail, c.noSlot} {
		ch <- d
	}
}

func (c *shieldCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.d.shield
	st.mu.Lock()
	eng := st.eng
	st.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.samplesDropped, prometheus.CounterValue, float64(st.dropped.Load()))
	ch <- prometheus.MustNewConstMetric(c.writeFail, prometheus.CounterValue, float64(st.failed.Load()))
	ch <- prometheus.MustNewConstMetric(c.noSlot, prometheus.CounterValue, float64(st.noSlot.Load()))
	enforced := map[shield.ActionKind]int{shield.Tighten: 0, shield.FingerprintRule: 0}
	would := map[shield.ActionKind]int{shield.Tighten: 0, shield.FingerprintRule: 0}
	var surges uint64
	var wd float64
	tracked := 0
	if eng != nil {
		enforced, would = eng.Active()
		surges, wd = eng.Counts()
		tracked = eng.Tracked()
	}
	for k, n := range enforced {
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, float64(n), string(k))
	}
	for k, n := range would {
		ch <- prometheus.MustNewConstMetric(c.would, prometheus.GaugeValue, float64(n), string(k))
	}
	ch <- prometheus.MustNewConstMetric(c.tracked, prometheus.GaugeValue, float64(tracked))
	ch <- prometheus.MustNewConstMetric(c.surges, prometheus.CounterValue, float64(surges))
	ch <- prometheus.MustNewConstMetric(c.wouldDrop, prometheus.CounterValue, wd)
}

// shieldOnPath are the shield's actions on a probe's path, for explain.
func (d *Daemon) shieldOnPath(v *explainView, p Probe, tr refmodel.Trace, rule *policy.CompiledRule) []control.ShieldAction {
	st := d.shield
	st.mu.Lock()
	eng := st.eng
	st.mu.Unlock()
	if eng == nil {
		return nil
	}
	s := shield.Sample{Src: p.Addr.Unmap(), Proto: p.Proto, SPort: p.SPort, DPort: p.DPort, Weight: 1}
	if p.Len > 14 {
		s.Len = uint16(min(p.Len-14, 65535)) // the frame's Ethernet header is not in the IP length
	}
	if rule != nil {
		s.Rule = rule.ID
	}
	if tr.Fact != nil {
		s.ASN = tr.Fact.ASN
	}
	if t := v.cur.asn; t != nil {
		if en, ok := t.Lookup(s.Src); ok {
			s.Country = en.Country
		}
	}
	var out []control.ShieldAction
	for _, a := range eng.ActionsFor(s, shield.FTTL|shield.FTCPFlags) {
		out = append(out, shieldAction(a, v.cur.names))
	}
	return out
}
