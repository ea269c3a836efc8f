// Package daemon runs Edgeguard on a host: it loads (or takes over) the data
// plane, attaches it to interfaces, applies the policy atomically, reloads
// it on SIGHUP and on file change, serves the control socket and metrics,
// and reports counters until its context ends.
package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	stdmaps "maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/examples"
	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/shield"
	"github.com/edgeguard/edgeguard/internal/version"
)

// Options configure a daemon.
type Options struct {
	// ConfigPath is the policy file; empty runs the built-in default
	// (examples/edgeguard.yaml).
	ConfigPath string
	// Ifaces, if set, replace the policy's interfaces, attached in Mode.
	Ifaces []string
	Mode   loader.Mode
	// PinDir is the bpffs directory for pinned maps and links.
	PinDir string
	// Socket is the control socket path; empty disables it.
	Socket string
	// StateDir keeps run-time list entries and the policy applied with
	// 'edgectl policy apply' across restarts and reboots; empty keeps them
	// in memory only.
	StateDir string
	// MetricsListen overrides the policy's metrics address; "off" disables.
	MetricsListen string
	// Keep leaves the program attached and enforcing when the daemon stops.
	Keep bool
	// IPv4DirectChunks, if set, is the IPv4 direct table's chunk budget
	// per generation (loader Sizes.V4Chunks), overriding the policy's
	// tables.ipv4_direct_chunks; 0 takes the policy's.
	IPv4DirectChunks uint32
	// Interval between counter lines on Out; 0 disables them.
	Interval time.Duration
	Out      io.Writer
	Logger   *slog.Logger
	// Reload triggers a reload of the policy file (SIGHUP).
	Reload <-chan struct{}
	// ReopenLogs reopens the L7 access log file (SIGUSR1, for logrotate).
	ReopenLogs <-chan struct{}
	// PollInterval is how often the policy file is checked for changes.
	PollInterval time.Duration
	// Build is the daemon's version, shown in status and exported as
	// edgeguard_build_info.
	Build version.Info
	// ASNProgress, if set, is told how far an ASN data load is (a CLI
	// draws a progress bar with it).
	ASNProgress func(done, total int64)
	// L7Loops is the L7 event loop engine's number of loops when the
	// policy sets no l7.loops (0: GOMAXPROCS). edgectl run passes the
	// cores it found before raising GOMAXPROCS by one.
	L7Loops int
}

// running is the policy in force.
type running struct {
	source   string
	raw      []byte
	pol      *policy.Policy
	compiled *policy.Compiled
	names    map[uint32]string // rule id -> name
	l7       *proxy.Config     // nil: no l7: section
	l7raw    []byte
	rls      *rls.Config // nil: no rate-limit service
	asn      *asn.Table  // its ASN data, nil without
}

// dynEntry is a list entry added at run time.
type dynEntry struct {
	expires time.Time // zero: until removed
	origin  string
	reason  string
	host    string // the fleet host that added an entry of origin fleet
}

// Daemon is a running Edgeguard.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	dp      *loader.Datapath
	m       *maps.Maps
	started time.Time

	// changeMu serializes policy changes (reloads and applies). It is held
	// while a policy is parsed, its ASN data loaded and its L7 stage
	// readied; mu is not, so status, lists and scrapes go on meanwhile.
	changeMu sync.Mutex
	fileRaw  []byte         // the config file's content as last read (changeMu)
	stopping bool           // the daemon stops: no change starts any more (changeMu)
	applied  *appliedPolicy // the running policy came from 'policy apply' (changeMu)
	asnPath  string         // ASN data cache (changeMu)
	asnStamp time.Time
	asnTable *asn.Table
	// staged, if set (tests), runs in apply between writing the new
	// generation and committing it: changeMu held, mu not.
	staged func()
	// afterStart are the state directory changes a start decided on
	// (setting a corrupt file aside, dropping a superseded applied
	// policy): made only once the start succeeded, so a start that fails
	// touches nothing.
	afterStart []func()
	starting   bool // start has not finished yet

	mu         sync.Mutex // guards what follows; held only to read it or commit a prepared change
	cur        running
	origin     string // why the running policy is the one running
	generation uint64
	lastReload control.ReloadInfo
	reloads    uint64
	failures   uint64
	lists      *runLists // the run-time list entries (lists.go), under mu
	atts       map[string]*loader.Attachment

	counters *counterWatch // the counters' readings (stats.go)
	top      *topTalkers
	recent   *recentSamples // last drop samples, for explain
	capture  *captureHub    // open captures (capture.go)
	samples  *sampleRings   // the sample ring readers (sampler.go)

	locks       []*os.File // flocks held while the daemon runs (pin dir, state dir)
	reg         *prometheus.Registry
	metricsLn   net.Listener // bound at start, before anything is loaded
	controlLn   net.Listener
	l7          *l7Run                 // the L7 stage and the rate-limit service (l7.go)
	standing    *standingWatch         // congestion state (standing.go)
	syn         *synStage              // the SYN path (syn.go); nil before the datapath loads
	fleet       *fleetLink             // fleet mode (fleet.go)
	shield      *shieldRun             // the adaptive shield (shield.go)
	bgp         *bgpRun                // the BGP speaker (bgp.go)
	subFailures *prometheus.CounterVec // generations a subscriber did not follow (subscribers.go)
}

// Run starts a daemon and blocks until ctx ends. A policy that does not
// validate is an error at start; later, a bad policy is logged and the
// running one kept.
func Run(ctx context.Context, o Options) error {
	d, err := start(ctx, o)
	if err != nil {
		return err
	}
	return d.serve(ctx)
}

// startUndo records what a start created, so that a failed start removes
// exactly that: it never detaches or unpins what an earlier run left
// enforcing.
type startUndo struct {
	pinDir bool // the pin directory was made by this start
	maps   bool // the pinned maps were created (not re-opened) by this start
}

func start(ctx context.Context, o Options) (_ *Daemon, err error) {
	d := newDaemon(o)
	d.starting = true
	var undo startUndo
	defer func() {
		if err != nil {
			d.undoStart(undo)
		}
	}()
	if undo.pinDir, err = d.lockPinDir(); err != nil {
		return nil, err
	}
	if err := d.lockStateDir(); err != nil {
		return nil, err
	}
	later := func(f func()) { d.afterStart = append(d.afterStart, f) }
	if err := d.lists.load(d.readStateFile, later); err != nil {
		return nil, err
	}
	raw, source, err := d.choosePolicy()
	if err != nil {
		return nil, err
	}
	next, err := d.prepare(ctx, raw, source)
	if err != nil {
		return nil, err
	}
	want := d.wantIfaces(next.pol)
	if len(want) == 0 {
		return nil, errors.New("no interface to protect: list interfaces in the policy or pass --iface IFACE")
	}
	if o.ConfigPath == "" && len(o.Ifaces) == 0 {
		names := slices.Sorted(stdmaps.Keys(want))
		d.log.Warn("no --config and no --iface: the built-in policy protects its own interfaces; pass --iface IFACE for another",
			"ifaces", strings.Join(names, ","))
	}
	// Addresses first: a taken port fails here, before anything is
	// loaded or attached.
	if err := d.listen(next); err != nil {
		return nil, err
	}
	if err := d.checkPins(); err != nil {
		return nil, err
	}
	if o.PinDir != "" {
		_, statErr := os.Stat(filepath.Join(o.PinDir, "maps"))
		undo.maps = errors.Is(statErr, os.ErrNotExist)
	}
	if err := d.loadDatapath(next); err != nil {
		return nil, err
	}
	if d.lists.corrupt && !undo.maps {
		d.lists.recover(next.pol, later)
	}
	if err := d.apply(ctx, next, "start"); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.tidyLinkPins() // links.go: pins no attachment took over
	d.mu.Unlock()
	for _, f := range d.afterStart {
		f()
	}
	d.afterStart, d.starting = nil, false
	d.recordPins()
	return d, nil
}

// undoStart removes what a failed start made: attachments it made (links
// it took over are released and keep enforcing), the maps it created, the
// pin directory if it made it, its listeners and locks.
func (d *Daemon) undoStart(u startUndo) {
	for _, a := range d.atts {
		a.Release()
	}
	d.atts = map[string]*loader.Attachment{}
	if d.dp != nil {
		d.dp.Close()
	}
	if d.metricsLn != nil {
		d.metricsLn.Close()
	}
	if d.controlLn != nil {
		d.controlLn.Close()
		os.Remove(d.opts.Socket)
	}
	if d.opts.PinDir != "" {
		switch {
		case u.pinDir:
			if err := loader.Unpin(d.opts.PinDir); err != nil {
				d.log.Error("failed start: remove the pins it made", "err", err)
			}
		case u.maps:
			if err := os.RemoveAll(filepath.Join(d.opts.PinDir, "maps")); err != nil {
				d.log.Error("failed start: remove the maps it made", "err", err)
			}
		}
	}
	d.unlock()
}

// loadDatapath loads (or re-opens from the pins) the data plane with the
// policy's table sizes. It applies nothing.
func (d *Daemon) loadDatapath(next running) error {
	t := next.pol.Tables
	if d.opts.IPv4DirectChunks != 0 && d.opts.IPv4DirectChunks != t.IPv4DirectChunks {
		d.log.Info("ipv4 direct table budget from --ipv4-direct-chunks; the policy's tables.ipv4_direct_chunks is ignored",
			"chunks", d.opts.IPv4DirectChunks, "policy_chunks", t.IPv4DirectChunks)
	}
	dp, err := loader.Load(loader.Options{Sizes: d.sizes(t), PinDir: d.opts.PinDir, Logger: d.log})
	if err != nil {
		return err
	}
	d.dp, d.m = dp, maps.New(dp)
	d.shield.m = d.m
	d.standing.useMaps(d.m)
	d.capture.gens = d.m.Generations
	d.lists.store = d.m.Lists
	d.counters.store = d.m.Counters
	d.samples.store = d.m.Samples
	d.syn = newSynStage(d.log, dp, d.opts.Keep, func(f func(map[string]*loader.Attachment)) {
		d.mu.Lock()
		defer d.mu.Unlock()
		f(d.atts)
	})
	return nil
}

// newDaemon is a daemon with nothing loaded yet: its options with
// defaults, empty run-time state and its metrics registry.
func newDaemon(o Options) *Daemon {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 2 * time.Second
	}
	d := &Daemon{
		opts:     o,
		log:      log,
		started:  time.Now(),
		atts:     map[string]*loader.Attachment{},
		counters: &counterWatch{log: log, history: newHistory(16), out: o.Out, interval: o.Interval},
		top:      newTopTalkers(5 * time.Minute),
		recent:   newRecentSamples(),
		standing: newStandingWatch(log),
	}
	d.shield = newShieldRun(log, d.statePath, d.readStateFile, func(c shield.Change) { d.bgp.shieldChange(c) })
	d.fleet = newFleetLink(log, d.newFleet, func() {
		if err := d.unwatchFleet(nil); err != nil {
			log.Warn("fleet stopped: let go of its aggregate watches", "err", err)
		}
	})
	d.lists = newRunLists(log, d.statePath(listsFile), func(f func(*policy.Policy)) {
		d.mu.Lock()
		defer d.mu.Unlock()
		f(d.cur.pol)
	})
	d.capture = newCaptureHub(log, func() []string {
		d.mu.Lock()
		defer d.mu.Unlock()
		return slices.Collect(stdmaps.Keys(d.atts))
	})
	d.samples = &sampleRings{log: log, capture: d.capture,
		drop: func(now time.Time, s maps.Sample) {
			d.top.add(now, s)
			d.recent.add(now, s)
			d.standing.congestionSample(now, s)
		},
		rate:        func(s maps.Sample) { d.shield.sample(s) },
		rateDropped: func() uint64 { return d.shield.dropped.Load() },
	}
	d.bgp = newBGPRun(log, d.statePath, d.readStateFile, d.counters.offeredRate, d.shield.actions)
	d.subFailures = newSubscriberFailures(d.subscribers())
	d.reg = d.newRegistry()
	d.l7 = newL7Run(log, o.L7Loops, o.ReopenLogs, d.standing, classStandings{d.standing}, func(ch control.ListChange) error {
		_, err := d.AddToList(control.Deny, ch)
		return err
	})
	d.reg.MustRegister(d.l7.collectors()...)
	return d
}

// wantIfaces are the interfaces to attach to, with their modes.
func (d *Daemon) wantIfaces(p *policy.Policy) map[string]loader.Mode {
	out := map[string]loader.Mode{}
	if len(d.opts.Ifaces) > 0 {
		for _, i := range d.opts.Ifaces {
			out[i] = d.opts.Mode
		}
		return out
	}
	for _, i := range p.Interfaces {
		m, err := loader.ParseMode(string(i.XDPMode))
		if err != nil {
			m = loader.ModeAuto
		}
		out[i.Name] = m
	}
	return out
}

func (d *Daemon) readConfig() ([]byte, string, error) {
	if d.opts.ConfigPath == "" {
		return examples.DefaultPolicy(), examples.DefaultPolicyName, nil
	}
	raw, err := os.ReadFile(d.opts.ConfigPath)
	if err != nil {
		return nil, "", fmt.Errorf("read policy: %w", err)
	}
	return raw, d.opts.ConfigPath, nil
}

// choosePolicy picks the policy to start with and logs which and why: the
// one last applied with 'edgectl policy apply' while the config file is
// unchanged since, else the config file (or the built-in policy).
func (d *Daemon) choosePolicy() ([]byte, string, error) {
	raw, source, err := d.readConfig()
	if err != nil {
		return nil, "", err
	}
	d.fileRaw = raw
	a, err := d.loadApplied()
	if err != nil {
		return nil, "", err
	}
	if a != nil && a.ConfigPath == d.opts.ConfigPath && a.ConfigSHA256 == sha256Hex(raw) {
		d.applied = a
		d.origin = fmt.Sprintf("applied with 'edgectl policy apply' at %s; %s unchanged since (state %s)",
			a.AppliedAt.UTC().Format(time.RFC3339), source, d.statePath(appliedFile))
		d.log.Info("running the applied policy", "policy", a.Source, "why", d.origin)
		return []byte(a.YAML), a.Source, nil
	}
	if a != nil {
		why := "the config file changed since the last 'edgectl policy apply'"
		if a.ConfigPath != d.opts.ConfigPath {
			why = fmt.Sprintf("the last 'edgectl policy apply' was made under --config %q; this start names %q",
				a.ConfigPath, d.opts.ConfigPath)
		}
		d.log.Info(why+": running the config file; the applied policy is dropped once this start succeeds",
			"policy", source, "superseded", d.statePath(appliedFile))
		d.afterStart = append(d.afterStart, d.dropApplied)
	}
	d.origin = "config file"
	if d.opts.ConfigPath == "" {
		d.origin = "built-in (no --config)"
	}
	d.log.Info("running the policy", "policy", source, "why", d.origin)
	return raw, source, nil
}

// prepare validates and compiles a policy, loading its ASN data if that
// changed, and refuses table sizes the loaded maps do not have. It
// touches no map. Caller holds changeMu (or is starting).
func (d *Daemon) prepare(ctx context.Context, raw []byte, source string) (running, error) {
	next, err := d.prepareAnySize(ctx, raw, source)
	if err == nil && d.dp != nil {
		err = d.checkSizes(next.pol.Tables)
	}
	if err != nil {
		return running{}, err
	}
	return next, nil
}

// prepareAnySize is prepare without the table size check (a diff shows a
// policy whose sizes differ, and says why applying it is refused).
func (d *Daemon) prepareAnySize(ctx context.Context, raw []byte, source string) (running, error) {
	p, err := policy.Parse(source, raw, os.ReadFile)
	if err != nil {
		return running{}, withL7Problems(err, raw, source)
	}
	table, err := d.asnData(ctx, p.ASNData.Path)
	if err != nil {
		return running{}, err
	}
	var entries []asn.Entry
	if table != nil {
		entries = slices.Collect(table.All())
	}
	c, err := policy.Compile(p, entries)
	if err != nil {
		return running{}, fmt.Errorf("compile policy %s: %w", source, err)
	}
	l7cfg, rlsCfg, l7raw, err := decodeL7(p, source)
	if err != nil {
		return running{}, err
	}
	if err := checkFleet(p); err != nil {
		return running{}, err
	}
	names := map[uint32]string{}
	for _, r := range c.Rules {
		names[r.ID] = r.Name
	}
	return running{source: source, raw: raw, pol: p, compiled: c, names: names, l7: l7cfg, l7raw: l7raw, rls: rlsCfg, asn: table}, nil
}

// sizes are the data plane's table sizes for the policy's tables section;
// the IPv4 direct table's budget is the flag's, else the policy's.
func (d *Daemon) sizes(t policy.Tables) loader.Sizes {
	s := loader.SizesOf(t)
	if d.opts.IPv4DirectChunks != 0 {
		s.V4Chunks = d.opts.IPv4DirectChunks
	}
	return s
}

// checkSizes refuses table sizes that differ from the loaded maps: those
// are fixed at load time. It names the policy fields that differ.
func (d *Daemon) checkSizes(t policy.Tables) error {
	have, want := d.dp.Sizes, d.sizes(t).WithDefaults()
	if want == have {
		return nil
	}
	var diffs []string
	for _, f := range []struct {
		field      string
		have, want uint32
	}{
		{"tables.max_rules", have.MaxRules, want.MaxRules},
		{"tables.per_source_entries", have.SrcEntries, want.SrcEntries},
		{"tables.aggregate_entries", have.AggEntries, want.AggEntries},
		{"tables.prefix_entries", have.PrefixEntries, want.PrefixEntries},
		{"tables.list_entries", have.ListEntries, want.ListEntries},
		{"tables.ipv4_direct_chunks", have.V4Chunks, want.V4Chunks},
		{"tables.standing_entries", have.StandingEntries, want.StandingEntries},
		{"l4 entries", have.L4Entries, want.L4Entries},
	} {
		if f.have != f.want {
			diffs = append(diffs, fmt.Sprintf("%s %d (loaded: %d)", f.field, f.want, f.have))
		}
	}
	return fmt.Errorf("tables: %s; table sizes are fixed when the maps are created: "+
		"restart with 'edgectl detach --unpin' first (all limiter state is lost)", strings.Join(diffs, ", "))
}

// asnData returns the ASN table for path, reloading it when the file
// changed. Caller holds changeMu (or is starting).
func (d *Daemon) asnData(ctx context.Context, path string) (*asn.Table, error) {
	if path == "" {
		return nil, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("asn data: %w", err)
	}
	if path == d.asnPath && st.ModTime().Equal(d.asnStamp) && d.asnTable != nil {
		return d.asnTable, nil
	}
	start := time.Now()
	t, err := asn.Load(ctx, []string{path}, asn.Options{Progress: d.opts.ASNProgress})
	if err != nil {
		return nil, fmt.Errorf("asn data: %w", err)
	}
	d.log.Info("asn data loaded", "path", path, "entries", t.Len(), "took", time.Since(start).Round(time.Millisecond))
	d.asnPath, d.asnStamp, d.asnTable = path, st.ModTime(), t
	return t, nil
}

// reload re-reads the policy file and applies it if it changed. A bad
// policy is logged and counted; the running one stays. While a policy
// applied with 'edgectl policy apply' runs, the file is applied only once
// its content changes (on SIGHUP as on a file change).
func (d *Daemon) reload(ctx context.Context, trigger string) {
	d.changeMu.Lock()
	defer d.changeMu.Unlock()
	raw, source, err := d.readConfig()
	if err != nil {
		d.fail(err, trigger)
		return
	}
	changed := !bytes.Equal(raw, d.fileRaw)
	if !changed && (trigger == "file-change" || d.applied != nil) {
		d.mu.Lock()
		if !d.lastReload.OK && d.lastReload.Trigger == "file-change" {
			// The file is readable again and what runs: in sync.
			d.lastReload = control.ReloadInfo{Time: time.Now(), OK: true, Trigger: trigger}
			d.log.Info("policy file readable again and unchanged: the running policy is the file's", "config", source)
		}
		d.mu.Unlock()
		if trigger != "file-change" {
			d.log.Info("config file unchanged since 'edgectl policy apply': the applied policy stays",
				"config", source, "applied", d.applied.Source)
		}
		return
	}
	next, err := d.prepare(ctx, raw, source)
	if err == nil {
		err = d.apply(ctx, next, trigger)
	}
	if err != nil {
		d.fail(err, trigger)
		return
	}
	d.fileRaw = raw
	if d.applied != nil {
		d.applied = nil
		d.dropApplied()
	}
	d.mu.Lock()
	d.origin = "config file"
	d.mu.Unlock()
}

// fail records a rejected change: the running policy, its generation and
// the data plane are as they were.
func (d *Daemon) fail(err error, trigger string) {
	d.mu.Lock()
	d.failures++
	d.lastReload = control.ReloadInfo{Time: time.Now(), OK: false, Error: err.Error(), Trigger: trigger}
	d.mu.Unlock()
	d.log.Error("policy rejected; the running policy stays in force", "trigger", trigger, "err", err)
}

// serve runs the daemon's loops until ctx ends, then stops.
func (d *Daemon) serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	run("control socket", d.serveControl)
	run("metrics", d.serveMetrics)
	run("samples", d.samples.readDrops)
	run("counters", d.counters.run)
	run("policy watch", d.watchPolicy)
	run("list expiry", d.lists.expire)
	run("escalations", d.l7.applyEscalations)
	run("log reopen", d.l7.reopenLogs)
	run("standing", d.standing.run)
	run("mptcp watch", d.syn.watchMPTCP)
	run("link watch", d.watchLinks)
	run("fleet", d.fleet.run)
	run("shield", d.shield.run)
	run("shield samples", d.samples.readRates)
	run("bgp", d.bgp.run)
	<-ctx.Done()
	wg.Wait()
	d.stop()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func (d *Daemon) stop() {
	// Their loops stopped them already; a policy change that finished
	// after (the control socket waits for one in progress) may have
	// started them again.
	d.fleet.stop()
	d.bgp.stop()
	// The L7 stage drains its requests without the daemon's locks held:
	// status and scrapes answer meanwhile.
	d.l7.close()
	d.mu.Lock()
	defer d.mu.Unlock()
	kept := true
	d.syn.stop()
	for name, a := range d.atts {
		if d.opts.Keep {
			// The pin is what keeps the program attached after exit: one
			// deleted by hand is put back, or the stop says loudly that
			// this interface is left unprotected.
			if pin := linkPinPath(d.opts.PinDir, name); d.opts.PinDir != "" {
				if _, err := os.Stat(pin); errors.Is(err, os.ErrNotExist) {
					// Unpin first: the link still believes it is pinned
					// there, and pinning to its own path does nothing.
					a.Link.Unpin()
					if err := a.Link.Pin(pin); err != nil {
						kept = false
						d.log.Error("--keep: the link pin was deleted and cannot be restored: the program leaves this interface now",
							"iface", name, "pin", pin, "err", err)
					} else {
						d.log.Warn("--keep: the link pin was deleted; pinned it again", "iface", name, "pin", pin)
					}
				}
			}
			a.Release()
			continue
		}
		if err := a.Detach(); err != nil {
			d.log.Error("detach", "iface", name, "err", err)
		}
	}
	d.dp.Close()
	defer d.unlock()
	if d.opts.Keep {
		if kept {
			d.log.Info("stopped; the program keeps enforcing from its pins", "pins", d.opts.PinDir)
		} else {
			d.log.Error("stopped; the program does NOT keep enforcing on every interface (see above)", "pins", d.opts.PinDir)
		}
		return
	}
	if err := loader.Unpin(d.opts.PinDir); err != nil {
		d.log.Error("unpin", "err", err)
	}
	d.log.Info("stopped and detached")
}

// watchPolicy reloads on the Reload channel (SIGHUP) and when the policy
// file's content changes. Polling, not inotify: every interval it reads
// the file (through symlinks) and compares a SHA-256 of the content, so it
// sees a file replaced by rename, a symlink flipped (Kubernetes
// ConfigMaps' ..data), and a file swapped for one of the same size and
// modification time (cp -p, rsync -a, packages). A file that cannot be read
// (deleted, a dangling symlink) is reported once as a failed reload, so
// status and the reload metrics say so without a SIGHUP; the running policy
// stays.
func (d *Daemon) watchPolicy(ctx context.Context) error {
	t := time.NewTicker(d.opts.PollInterval)
	defer t.Stop()
	d.changeMu.Lock()
	last := sha256Hex(d.fileRaw) // what the watcher last acted on
	d.changeMu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.opts.Reload:
			d.log.Info("reload requested", "trigger", "sighup")
			d.reload(ctx, "sighup")
		case <-t.C:
			if d.opts.ConfigPath == "" {
				continue
			}
			raw, err := os.ReadFile(d.opts.ConfigPath)
			if err != nil {
				if target, lerr := os.Readlink(d.opts.ConfigPath); lerr == nil {
					err = fmt.Errorf("%w: a dangling symlink to %s", err, target)
				}
				seen := "error: " + err.Error()
				if seen != last {
					last = seen
					d.fail(fmt.Errorf("read policy: %w (the running policy stays; fix the file or the symlink)", err), "file-change")
				}
				continue
			}
			sum := sha256Hex(raw)
			if sum == last {
				continue
			}
			last = sum
			// reload re-reads and compares the content with the running
			// policy's file, so a file put back as it was changes nothing.
			d.reload(ctx, "file-change")
		}
	}
}
