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
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/examples"
	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/stage"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
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
	// StateDir keeps run-time list entries across restarts; empty keeps
	// them in memory only.
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
	// PollInterval is how often the policy file is checked for changes.
	PollInterval time.Duration
	Version      string
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
}

// dynEntry is a list entry added at run time.
type dynEntry struct {
	expires time.Time // zero: until removed
	origin  string
	reason  string
}

// Daemon is a running Edgeguard.
type Daemon struct {
	opts Options
	log  *slog.Logger
	dp   *loader.Datapath
	m    *maps.Maps

	mu         sync.Mutex // serializes every change of policy, lists, attachments
	cur        running
	generation uint64
	lastReload control.ReloadInfo
	reloads    uint64
	failures   uint64
	dyn        map[control.ListKind]map[netip.Prefix]dynEntry
	asnPath    string
	asnStamp   time.Time
	asnTable   *asn.Table
	atts       map[string]*loader.Attachment

	history *history
	top     *topTalkers

	lock        *os.File // held while the daemon runs (lockState)
	reg         *prometheus.Registry
	l7          *stage.Stage
	escalations chan control.ListChange
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

func start(ctx context.Context, o Options) (_ *Daemon, err error) {
	d := newDaemon(o)
	if err := d.lockState(); err != nil {
		return nil, err
	}
	if err := d.loadLists(); err != nil {
		return nil, err
	}
	raw, source, err := d.readConfig()
	if err != nil {
		return nil, err
	}
	next, err := d.prepare(ctx, raw, source)
	if err != nil {
		return nil, err
	}
	ifaces := d.wantIfaces(next.pol)
	if len(ifaces) == 0 {
		return nil, errors.New("no interface to protect: list interfaces in the policy or pass --iface IFACE")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// The L7 stage's listener is bound before anything is loaded: a taken
	// port fails the start with nothing attached.
	commitL7, abortL7, err := d.prepareL7(ctx, &next)
	if err != nil {
		return nil, err
	}
	if err := d.loadDatapath(next); err != nil {
		abortL7()
		return nil, err
	}
	if err := d.syncAttachments(); err != nil {
		abortL7()
		d.dp.Close()
		return nil, err
	}
	commitL7()
	return d, nil
}

// loadDatapath loads (or re-opens from the pins) the data plane with the
// policy's table sizes and applies the policy. Caller holds d.mu.
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
	if err := d.commit(next, "start"); err != nil {
		dp.Close()
		return err
	}
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
		opts:        o,
		log:         log,
		dyn:         map[control.ListKind]map[netip.Prefix]dynEntry{control.Deny: {}, control.Allow: {}},
		atts:        map[string]*loader.Attachment{},
		history:     newHistory(16),
		top:         newTopTalkers(5 * time.Minute),
		escalations: make(chan control.ListChange, 256),
	}
	d.reg = d.newRegistry()
	d.l7 = stage.New(stage.Options{Logger: log.With("stage", "l7"), Escalator: d, Loops: o.L7Loops})
	d.reg.MustRegister(d.l7.Collector())
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

// syncAttachments attaches to interfaces the policy gained and detaches
// from those it lost. Caller holds d.mu.
func (d *Daemon) syncAttachments() error {
	want := d.wantIfaces(d.cur.pol)
	for name, mode := range want {
		if _, ok := d.atts[name]; ok {
			continue
		}
		a, err := d.dp.Attach(name, mode)
		if err != nil {
			return err
		}
		d.atts[name] = a
		d.log.Info("attached", "iface", name, "mode", a.Mode)
	}
	for name, a := range d.atts {
		if _, ok := want[name]; ok {
			continue
		}
		if err := a.Detach(); err != nil {
			return err
		}
		delete(d.atts, name)
		d.log.Info("detached", "iface", name)
	}
	return nil
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

// prepare validates and compiles a policy, loading its ASN data if that
// changed. It touches no map.
func (d *Daemon) prepare(ctx context.Context, raw []byte, source string) (running, error) {
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
	l7cfg, l7raw, err := decodeL7(p, source)
	if err != nil {
		return running{}, err
	}
	if d.dp != nil {
		if err := d.checkSizes(p.Tables); err != nil {
			return running{}, err
		}
	}
	names := map[uint32]string{}
	for _, r := range c.Rules {
		names[r.ID] = r.Name
	}
	return running{source: source, raw: raw, pol: p, compiled: c, names: names, l7: l7cfg, l7raw: l7raw}, nil
}

// sizes are the data plane's table sizes for the policy's tables section;
// the IPv4 direct table's budget is the flag's, else the policy's.
func (d *Daemon) sizes(t policy.Tables) loader.Sizes {
	s := loader.Sizes{
		MaxRules: t.MaxRules, SrcEntries: t.PerSourceEntries, AggEntries: t.AggregateEntries,
		PrefixEntries: t.PrefixEntries, ListEntries: t.ListEntries, V4Chunks: t.IPv4DirectChunks,
	}
	if d.opts.IPv4DirectChunks != 0 {
		s.V4Chunks = d.opts.IPv4DirectChunks
	}
	return s
}

// checkSizes refuses table sizes that differ from the loaded maps: those
// are fixed at load time.
func (d *Daemon) checkSizes(t policy.Tables) error {
	s := d.dp.Sizes
	if d.sizes(t).WithDefaults() != s {
		return fmt.Errorf("tables: sizes differ from the loaded maps (%+v); table sizes are fixed at load time: "+
			"restart with 'edgectl detach --unpin' first (all limiter state is lost)", s)
	}
	return nil
}

// asnData returns the ASN table for path, reloading it when the file changed.
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

// commit makes next the running policy: a new data-plane generation, then
// the lists. Caller holds d.mu.
func (d *Daemon) commit(next running, trigger string) error {
	if err := d.m.Apply(Generation(next.compiled)); err != nil {
		return fmt.Errorf("apply policy: %w", err)
	}
	d.cur = next
	d.generation++
	if err := d.syncLists(); err != nil {
		return err
	}
	d.lastReload = control.ReloadInfo{Time: time.Now(), OK: true, Trigger: trigger}
	d.reloads++
	gen, _ := d.m.ActiveGen()
	d.log.Info("policy applied", "policy", next.source, "generation", d.generation, "dataplane_generation", gen,
		"rules", len(next.compiled.Rules), "prefixes", len(next.compiled.Prefixes), "trigger", trigger)
	for _, w := range next.compiled.Warnings {
		d.log.Warn("policy warning", "policy", next.source, "warning", w)
	}
	return nil
}

// reload re-reads the policy file and applies it if it changed. A bad
// policy is logged and counted; the running one stays.
func (d *Daemon) reload(ctx context.Context, trigger string) {
	raw, source, err := d.readConfig()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && bytes.Equal(raw, d.cur.raw) && trigger == "file-change" {
		return
	}
	if err == nil {
		err = d.applyLocked(ctx, raw, source, trigger)
	}
	if err != nil {
		d.failLocked(err, trigger)
	}
}

func (d *Daemon) failLocked(err error, trigger string) {
	d.failures++
	d.lastReload = control.ReloadInfo{Time: time.Now(), OK: false, Error: err.Error(), Trigger: trigger}
	d.log.Error("policy rejected; the running policy stays in force", "trigger", trigger, "err", err)
}

func (d *Daemon) applyLocked(ctx context.Context, raw []byte, source, trigger string) error {
	next, err := d.prepare(ctx, raw, source)
	if err != nil {
		return err
	}
	commitL7, abortL7, err := d.prepareL7(ctx, &next)
	if err != nil {
		return err
	}
	if err := d.commit(next, trigger); err != nil {
		abortL7()
		return err
	}
	if err := d.syncAttachments(); err != nil {
		abortL7()
		return err
	}
	commitL7()
	return nil
}

// syncLists writes the policy's lists merged with the run-time entries.
// Caller holds d.mu.
func (d *Daemon) syncLists() error {
	deny := slices.Clone(d.cur.pol.Deny)
	allow := slices.Clone(d.cur.pol.Allow)
	now := time.Now()
	for kind, entries := range d.dyn {
		for p, e := range entries {
			if !e.expires.IsZero() && !e.expires.After(now) {
				delete(entries, p)
				continue
			}
			le := policy.ListEntry{Prefix: p, Expires: e.expires, Source: e.origin}
			if kind == control.Deny {
				deny = append(deny, le)
			} else {
				allow = append(allow, le)
			}
		}
	}
	entries, err := ListEntries(policy.CompileLists(deny, allow))
	if err != nil {
		return err
	}
	if err := d.m.SetLists(entries); err != nil {
		return fmt.Errorf("write lists: %w", err)
	}
	return nil
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
	run("samples", d.readSamples)
	run("counters", d.sampleCounters)
	run("policy watch", d.watchPolicy)
	run("list expiry", d.expireLists)
	run("escalations", d.applyEscalations)
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
	// The L7 stage drains (up to its shutdown timeout) without the lock.
	d.l7.Close()
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, a := range d.atts {
		if d.opts.Keep {
			a.Release()
			continue
		}
		if err := a.Detach(); err != nil {
			d.log.Error("detach", "iface", name, "err", err)
		}
	}
	d.dp.Close()
	if d.opts.Keep {
		d.log.Info("stopped; the program keeps enforcing from its pins", "pins", d.opts.PinDir)
		return
	}
	if err := loader.Unpin(d.opts.PinDir); err != nil {
		d.log.Error("unpin", "err", err)
	}
	d.log.Info("stopped and detached")
}

// watchPolicy reloads on the Reload channel (SIGHUP) and when the policy
// file's content changes. Polling, not inotify: it also sees a file
// replaced by rename or a symlink flipped (as config management and
// Kubernetes ConfigMaps do), and costs one stat per interval.
func (d *Daemon) watchPolicy(ctx context.Context) error {
	t := time.NewTicker(d.opts.PollInterval)
	defer t.Stop()
	var lastMod time.Time
	var lastSize int64 = -1
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
			st, err := os.Stat(d.opts.ConfigPath)
			if err != nil {
				continue
			}
			if st.ModTime().Equal(lastMod) && st.Size() == lastSize {
				continue
			}
			lastMod, lastSize = st.ModTime(), st.Size()
			// reload compares the content with the running policy, so
			// the first look (and a touch) changes nothing.
			d.reload(ctx, "file-change")
		}
	}
}

// expireLists drops expired run-time list entries from the daemon's view.
// The data plane already ignores them once past their expiry.
func (d *Daemon) expireLists(ctx context.Context) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.mu.Lock()
			expired := false
			now := time.Now()
			for _, entries := range d.dyn {
				for _, e := range entries {
					if !e.expires.IsZero() && !e.expires.After(now) {
						expired = true
					}
				}
			}
			if expired {
				if err := d.syncLists(); err != nil {
					d.log.Error("expire list entries", "err", err)
				}
				if err := d.saveLists(); err != nil {
					d.log.Error("save list entries", "err", err)
				}
			}
			d.mu.Unlock()
		}
	}
}
