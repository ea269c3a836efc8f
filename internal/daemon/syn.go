package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
	"github.com/edgeguard/edgeguard/internal/sockdiag"
)

// synStage is the SYN path as the daemon runs it (docs/tcp.md): loaded in
// front of the limiter when the kernel has what it needs, configured from
// the policy's syn: section.
type synStage struct {
	log    *slog.Logger
	dp     *loader.Datapath
	keep   bool                                           // --keep: stop releases the path, pinned
	locked func(func(atts map[string]*loader.Attachment)) // runs under the daemon's mu

	// Under the daemon's mu: the path's loading, and the section of the
	// generation last followed (watchMPTCP re-applies it).
	section *policy.SYN

	mu          sync.Mutex // guards names (read by metrics and stats)
	path        *loader.SynPath
	m           *maps.Syn
	names       []string          // service id -> name
	always      []bool            // service id -> protection: always
	svcs        []maps.SynService // service id -> what the data plane holds
	mptcp       []bool            // service id -> its listener is MPTCP: its SYNs go to the kernel
	unavailable error             // why the SYN path is off on this kernel
}

// synSysctls are what the SYN path needs from the kernel's TCP settings
// (deploy/sysctl.d/60-edgeguard-syn.conf ships them): with
// tcp_syncookies 0 the kernel takes no cookie request, with 2 it answers
// every SYN that reaches it itself; without timestamps, SACK or window
// scaling it refuses requests that carry them.
var synSysctls = []struct{ key, want string }{
	{"net/ipv4/tcp_syncookies", "1"},
	{"net/ipv4/tcp_timestamps", "1"},
	{"net/ipv4/tcp_sack", "1"},
	{"net/ipv4/tcp_window_scaling", "1"},
}

// checkSynSysctls returns what is set differently from what the SYN path
// needs, as "key=have (want W)".
func checkSynSysctls(read func(string) ([]byte, error)) []string {
	var bad []string
	for _, s := range synSysctls {
		b, err := read("/proc/sys/" + s.key)
		have := strings.TrimSpace(string(b))
		if err != nil {
			have = "unreadable: " + err.Error()
		}
		if have != s.want {
			bad = append(bad, fmt.Sprintf("%s=%s (want %s)", strings.ReplaceAll(s.key, "/", "."), have, s.want))
		}
	}
	return bad
}

// newSynStage makes the SYN stage of a loaded data plane. Nothing is
// probed or loaded until a policy protects a service (apply): a policy
// without a syn: section runs the limiter exactly as before, at no cost.
// locked runs a function with the daemon's attachments, under the
// daemon's mu (the attachments are the daemon's; the SYN path follows
// them); keep releases the path at stop instead of removing it (--keep).
func newSynStage(log *slog.Logger, dp *loader.Datapath, keep bool, locked func(func(atts map[string]*loader.Attachment))) *synStage {
	return &synStage{log: log, dp: dp, keep: keep, locked: locked}
}

// follow writes the generation's SYN services. It keeps the limiter
// running alone when the SYN path cannot be loaded or written ('edgectl
// stats' says why).
func (st *synStage) follow(_ context.Context, c committed) error {
	if st == nil {
		return nil // no data plane loaded
	}
	var errs []error
	st.locked(func(atts map[string]*loader.Attachment) {
		st.section = c.run.pol.SYN
		if err := st.apply(c.run.pol.SYN, atts); err != nil {
			errs = append(errs, fmt.Errorf("the policy's syn: section is not in force: %w", err))
		}
		if err := st.syncTC(atts); err != nil {
			errs = append(errs, fmt.Errorf("tcx hand-off: %w", err))
		}
	})
	return errors.Join(errs...)
}

// load puts the SYN path in front of the limiter: loaded, and swapped
// into every attached interface's link (atomic, no packet unseen). Caller
// holds the daemon's mu.
func (st *synStage) load(atts map[string]*loader.Attachment) error {
	p, err := loader.LoadSyn(st.dp, loader.SynOptions{Logger: st.log})
	if err != nil {
		st.unavailable = err
		return err
	}
	if bad := checkSynSysctls(os.ReadFile); len(bad) > 0 {
		st.log.Warn("syn protection: kernel settings differ from what it needs; "+
			"install deploy/sysctl.d/60-edgeguard-syn.conf (sysctl --system)", "sysctls", strings.Join(bad, ", "))
	}
	for name, a := range atts {
		if err := a.Link.Update(st.dp.Entry()); err != nil {
			// Put back what was there; the limiter keeps running alone.
			st.dp.ClearEntry()
			for _, b := range atts {
				b.Link.Update(st.dp.Entry())
			}
			p.Close()
			st.unavailable = err
			return fmt.Errorf("put the syn path in front of the limiter on %s: %w", name, err)
		}
	}
	st.path, st.m = p, maps.NewSyn(p)
	st.unavailable = nil
	st.log.Info("syn protection loaded (XDP SYN cookies, tcx request hand-off)")
	return nil
}

// synServices turns the policy's syn: section into the data plane's form.
func synServices(s *policy.SYN) ([]maps.SynService, []string, []bool) {
	if s == nil {
		return nil, nil, nil
	}
	perSecond := func(r policy.Rate) uint64 {
		if r.Per <= 0 {
			return 0
		}
		return r.Count * uint64(time.Second) / uint64(r.Per)
	}
	rate := func(l policy.Limit) maps.Rate {
		return maps.Rate{Count: l.Rate.Count, Per: l.Rate.Per, Burst: l.Burst}
	}
	modes := map[policy.SYNMode]maps.SynMode{
		policy.SYNOff: maps.SynOff, policy.SYNMonitor: maps.SynMonitor, policy.SYNAuto: maps.SynAuto, policy.SYNAlways: maps.SynAlways,
	}
	out := make([]maps.SynService, 0, len(s.Services))
	names := make([]string, 0, len(s.Services))
	always := make([]bool, 0, len(s.Services))
	for _, svc := range s.Services {
		out = append(out, maps.SynService{
			Mode: modes[svc.Protection], Endpoints: svc.Listen,
			MSS4: svc.MSS, MSS6: svc.MSS6, WScale: svc.WindowScale,
			OnRate: perSecond(svc.On), OffRate: perSecond(svc.Off), Hold: svc.Hold,
			OutOfState: rate(svc.OutOfState), Answers: rate(svc.Answers),
			AnswerLen4: svc.AnswerPrefix4, AnswerLen6: svc.AnswerPrefix6,
			ValidatedFor: s.ValidatedFor,
		})
		names = append(names, svc.Name)
		always = append(always, svc.Protection == policy.SYNAlways)
	}
	return out, names, always
}

// apply writes the section's protected services. Caller holds the
// daemon's mu.
func (st *synStage) apply(sec *policy.SYN, atts map[string]*loader.Attachment) error {
	svcs, names, always := synServices(sec)
	if st.path == nil {
		if len(svcs) == 0 {
			return nil
		}
		if st.unavailable != nil && errors.Is(st.unavailable, loader.ErrSynUnavailable) {
			st.log.Warn("policy protects TCP services but syn protection is off on this kernel", "why", st.unavailable)
			return nil
		}
		if err := st.load(atts); err != nil {
			if errors.Is(err, loader.ErrSynUnavailable) {
				st.log.Warn("policy protects TCP services but syn protection is off on this kernel", "why", err)
			} else {
				st.log.Error("syn protection off: loading it failed; the limiter runs alone", "err", err)
			}
			return nil
		}
		if err := st.syncTC(atts); err != nil {
			return err
		}
	}
	mptcp := st.passMPTCP(svcs, names)
	if err := st.m.ApplySyn(svcs); err != nil {
		return fmt.Errorf("apply syn services: %w", err)
	}
	st.mu.Lock()
	st.names, st.always, st.svcs, st.mptcp = names, always, svcs, mptcp
	st.mu.Unlock()
	return nil
}

// passMPTCP turns protection off (SYNs to the kernel) for each service
// whose listener is MPTCP, loudly: the data plane answers a SYN with a
// plain-TCP cookie SYN-ACK, which an MPTCP client's first connection does
// not survive (it is reset). It asks the kernel (sock_diag) which sockets
// listen with MPTCP; when it cannot, nothing changes and it says so.
func (st *synStage) passMPTCP(svcs []maps.SynService, names []string) []bool {
	out := make([]bool, len(svcs))
	if len(svcs) == 0 {
		return out
	}
	ls, err := sockdiag.MPTCPListeners()
	if err != nil {
		st.log.Warn("syn protection: cannot tell whether protected services listen with MPTCP", "err", err)
		return out
	}
	for i := range svcs {
		if !mptcpCovers(svcs[i].Endpoints, ls) {
			continue
		}
		out[i] = true
		svcs[i].Mode = maps.SynOff
		st.log.Warn("syn protection OFF for a service whose listener is MPTCP: its SYNs go to the kernel (the data "+
			"plane's cookie SYN-ACK would reset every new MPTCP client's first connection); make the listener plain "+
			"TCP (Go: ListenConfig.SetMultipathTCP(false), or GODEBUG=multipathtcp=0) to protect it",
			"service", names[i], "endpoints", fmt.Sprint(svcs[i].Endpoints))
	}
	return out
}

// mptcpCovers says whether an MPTCP listener serves one of endpoints: the
// same port, and the same address or a wildcard on either side.
func mptcpCovers(endpoints, listeners []netip.AddrPort) bool {
	for _, e := range endpoints {
		for _, l := range listeners {
			if e.Port() == l.Port() && (e.Addr().IsUnspecified() || l.Addr().IsUnspecified() || e.Addr().Unmap() == l.Addr().Unmap()) {
				return true
			}
		}
	}
	return false
}

// watchMPTCP re-checks every 5 seconds whether protected services listen
// with MPTCP (a restarted server may change), and re-applies the SYN
// services of the generation last followed when that changed.
func (st *synStage) watchMPTCP(ctx context.Context) error {
	return ticking(ctx, 5*time.Second, st.checkMPTCP)
}

// checkMPTCP is one check of watchMPTCP.
func (st *synStage) checkMPTCP() {
	var svcs []maps.SynService
	var was []bool
	st.locked(func(map[string]*loader.Attachment) {
		if st.path != nil {
			svcs, _, _ = synServices(st.section)
			st.mu.Lock()
			was = slices.Clone(st.mptcp)
			st.mu.Unlock()
		}
	})
	if len(svcs) == 0 {
		return
	}
	ls, err := sockdiag.MPTCPListeners()
	if err != nil {
		return
	}
	changed := len(was) != len(svcs)
	for i := range svcs {
		if i < len(was) && mptcpCovers(svcs[i].Endpoints, ls) != was[i] {
			changed = true
		}
	}
	if !changed {
		return
	}
	st.locked(func(atts map[string]*loader.Attachment) {
		st.log.Info("syn protection: a protected service's listener changed between TCP and MPTCP; re-applying")
		if err := st.apply(st.section, atts); err != nil {
			st.log.Error("syn protection: re-apply after a listener change", "err", err)
		}
	})
}

// syncTC puts the tcx program on every attached interface. Caller holds
// the daemon's mu.
func (st *synStage) syncTC(atts map[string]*loader.Attachment) error {
	if st == nil || st.path == nil {
		return nil
	}
	for name := range atts {
		if err := st.path.AttachTC(name); err != nil {
			return err
		}
	}
	for _, name := range st.path.TCIfaces() {
		if _, ok := atts[name]; !ok {
			if err := st.path.DetachTC(name); err != nil {
				return err
			}
		}
	}
	return nil
}

// tcIfaces are the interfaces the tcx program is on. Caller holds the
// daemon's mu.
func (st *synStage) tcIfaces() []string {
	if st == nil || st.path == nil {
		return nil
	}
	return st.path.TCIfaces()
}

// stop releases the SYN path (kept, pinned, with --keep) or removes it.
// Caller holds the daemon's mu.
func (st *synStage) stop() {
	if st == nil || st.path == nil {
		return
	}
	if st.keep {
		st.path.Release()
		return
	}
	if err := st.path.Close(); err != nil {
		st.log.Error("syn path close", "err", err)
	}
}

// synStats are the per-service counters for `edgectl stats`.
func (d *Daemon) synStats() *control.SYNStats {
	d.mu.Lock()
	st := d.syn
	d.mu.Unlock()
	return st.stats()
}

// stats reads the counters; nil for a daemon without a SYN stage.
func (st *synStage) stats() *control.SYNStats {
	if st == nil {
		return nil
	}
	out := &control.SYNStats{Available: st.path != nil}
	if st.path == nil {
		if st.unavailable != nil {
			out.Unavailable = st.unavailable.Error()
		} else {
			out.Unavailable = "no protected service in the policy (syn: section)"
		}
		return out
	}
	st.mu.Lock()
	names, always, mptcp := st.names, st.always, st.mptcp
	st.mu.Unlock()
	cs, err := st.m.SynCounters(len(names))
	if err != nil {
		out.Error = err.Error()
		return out
	}
	for i, c := range cs {
		out.Services = append(out.Services, control.SYNServiceStat{
			Service: names[i], Active: (c.Active || always[i]) && !(i < len(mptcp) && mptcp[i]),
			MPTCPListener: i < len(mptcp) && mptcp[i], SYNs: c.SYNs, Answered: c.Answered, WouldAnswer: c.WouldAnswer,
			AnswerLimited: c.AnswerLimited, CookiesValid: c.CookieValid, CookiesInvalid: c.CookieInvalid,
			OutOfStateDropped: c.OutOfStateDrop, OutOfStatePassed: c.OutOfStateBudget, Established: c.Established,
			ValidatedPassed: c.ValidatedPass, Requests: c.Requests, RequestFailures: c.RequestFailures,
			BadSYNs: c.BadSYN, Denied: c.Denied, Activations: c.Activations,
		})
	}
	return out
}

// synCollector exports the SYN path's counters at scrape time.
type synCollector struct {
	d        *Daemon
	counter  *prometheus.Desc
	active   *prometheus.Desc
	loaded   *prometheus.Desc
	failures *prometheus.Desc
	mptcp    *prometheus.Desc
}

func newSynCollector(d *Daemon) *synCollector {
	return &synCollector{
		d: d,
		counter: prometheus.NewDesc("edgeguard_syn_packets_total",
			"SYN path decisions per protected service (docs/tcp.md): syn, answered, would_answer, answer_limited, "+
				"bad_syn, validated_pass, cookie_valid, cookie_invalid, out_of_state_drop, out_of_state_pass, "+
				"established, request, request_failed, deny.", []string{"service", "event"}, nil),
		active: prometheus.NewDesc("edgeguard_syn_protection_active",
			"1 while the service's SYNs are answered by the data plane (always, or auto while on).", []string{"service"}, nil),
		loaded: prometheus.NewDesc("edgeguard_syn_path_loaded",
			"1 when the SYN path is in front of the limiter; 0 before a policy protects a service, or when this kernel "+
				"lacks what it needs (the log and edgectl stats say which).", nil, nil),
		failures: prometheus.NewDesc("edgeguard_syn_activations_total",
			"Times auto protection turned on, per service.", []string{"service"}, nil),
		mptcp: prometheus.NewDesc("edgeguard_syn_mptcp_listener",
			"1 while the service's listener is MPTCP: its SYNs go to the kernel, protection is off for it (docs/tcp.md).",
			[]string{"service"}, nil),
	}
}

func (c *synCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.counter
	ch <- c.active
	ch <- c.loaded
	ch <- c.failures
	ch <- c.mptcp
}

func (c *synCollector) Collect(ch chan<- prometheus.Metric) {
	synStatsToMetrics(c, c.d.synStats(), ch)
}

// synStatsToMetrics writes one stats reading as metrics.
func synStatsToMetrics(c *synCollector, st *control.SYNStats, ch chan<- prometheus.Metric) {
	if st == nil {
		return
	}
	loaded := 0.0
	if st.Available {
		loaded = 1
	}
	ch <- prometheus.MustNewConstMetric(c.loaded, prometheus.GaugeValue, loaded)
	for _, s := range st.Services {
		for event, v := range map[string]uint64{
			"syn": s.SYNs, "answered": s.Answered, "would_answer": s.WouldAnswer, "answer_limited": s.AnswerLimited,
			"bad_syn": s.BadSYNs, "validated_pass": s.ValidatedPassed, "cookie_valid": s.CookiesValid,
			"cookie_invalid": s.CookiesInvalid, "out_of_state_drop": s.OutOfStateDropped,
			"out_of_state_pass": s.OutOfStatePassed, "established": s.Established, "request": s.Requests,
			"request_failed": s.RequestFailures, "deny": s.Denied,
		} {
			ch <- prometheus.MustNewConstMetric(c.counter, prometheus.CounterValue, float64(v), s.Service, event)
		}
		active := 0.0
		if s.Active {
			active = 1
		}
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, active, s.Service)
		ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(s.Activations), s.Service)
		mp := 0.0
		if s.MPTCPListener {
			mp = 1
		}
		ch <- prometheus.MustNewConstMetric(c.mptcp, prometheus.GaugeValue, mp, s.Service)
	}
}

// explainSYN is the SYN path's part of `edgectl explain`: for each
// protected service, a bare SYN from ip to one of its endpoints (of ip's
// family; the probe's port first) decided by the SYN path's model
// (refmodel.DecideSYN) on the data plane's state read now (the limiter's
// st, shared lists and standing, and the SYN path's maps), with the steps
// the model took, the answer budget it read and the service's counters.
// Nothing is charged. nil when the policy protects no service.
func explainSYN(v *explainView, st *maps.State, ip netip.Addr, p Probe) (*control.ExplainSYN, error) {
	sp := v.syn
	if sp == nil || v.cur.pol == nil || v.cur.pol.SYN == nil || len(v.cur.pol.SYN.Services) == 0 {
		return nil, nil
	}
	stats := sp.stats()
	out := &control.ExplainSYN{Available: stats != nil && stats.Available}
	if !out.Available {
		if stats != nil {
			out.Unavailable = stats.Unavailable
		}
		return out, nil
	}
	ss, err := sp.m.ReadSynState()
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	sp.mu.Lock()
	svcs, names := sp.svcs, sp.names
	sp.mu.Unlock()
	// One model for every service: a bare SYN changes only its own
	// service's state and answer budget (and no standing), so one
	// service's question does not change another's answer.
	model, err := refmodel.FromState(st)
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	model.LoadSyn(ss)
	wall := time.Now()
	sport := p.SPort
	if p.Proto != 6 || sport == 0 {
		sport = 40000
	}
	for id, svc := range svcs {
		x := control.ExplainSYNService{Service: names[id], Protection: maps.SynModeName(svc.Mode)}
		if id < len(stats.Services) {
			x.Counters = stats.Services[id]
			x.Active = x.Counters.Active
		}
		dst, ok := synProbeDst(ip, svc, p)
		for _, ep := range svc.Endpoints {
			if p.Proto == 6 && p.DPort == ep.Port() {
				x.Probe = true
			}
		}
		if !ok {
			x.Next = "not asked: the service has no endpoint of the address's family"
			out.Services = append(out.Services, x)
			continue
		}
		v, tr := model.DecideSYN(refmodel.SynProbeFrame(netip.AddrPortFrom(ip, sport), dst, 0x02), refmodel.SynNoSocket, ss.NowNS)
		if err := model.LiveErr(); err != nil {
			return nil, fmt.Errorf("explain: read the data plane's tables: %w", err)
		}
		if tr.BareSYN {
			x.Active = tr.Active
		}
		if tr.AnswerKey != nil {
			x.AnswerPrefix = tr.AnswerPrefix()
			x.AnswersAvailable, x.AnswersBurst = tr.AnswersLeft(ss.NowNS)
		}
		var until *time.Time
		if tr.Bypass {
			until = st.WallTime(tr.Standing.Since+tr.Service.ValidatedNs, wall)
			out.Bypass, out.BypassUntil = true, until
		}
		x.Steps = synSteps(st, ss.NowNS, dst, v, tr, wall)
		x.Next = synNext(v, tr, until, x.AnswerPrefix)
		if x.Probe && p.Flags != 0 && p.Flags&0x17 != 0x02 {
			// The probe's own segment, not a bare SYN, to a model of its
			// own (the SYN above counted in this one's auto window).
			pm, err := refmodel.FromState(st)
			if err != nil {
				return nil, fmt.Errorf("explain: %w", err)
			}
			pm.LoadSyn(ss)
			pv, _ := pm.DecideSYN(refmodel.SynProbeFrame(netip.AddrPortFrom(ip, sport), dst, p.Flags), refmodel.SynNoSocket, ss.NowNS)
			if err := pm.LiveErr(); err != nil {
				return nil, fmt.Errorf("explain: read the data plane's tables: %w", err)
			}
			x.ProbeSegment = synSegmentNext(pv, p.Flags)
		}
		out.Services = append(out.Services, x)
	}
	return out, nil
}

// synProbeDst is the endpoint explain sends its SYN to: of ip's family
// (an any-address endpoint stands for every local address), the probe's
// destination port first.
func synProbeDst(ip netip.Addr, svc maps.SynService, p Probe) (netip.AddrPort, bool) {
	var best netip.AddrPort
	found := false
	for _, ep := range svc.Endpoints {
		a := ep.Addr().Unmap()
		switch {
		case a.IsUnspecified():
			a = netip.IPv4Unspecified()
			if ip.Is6() {
				a = netip.IPv6Unspecified()
			}
		case a.Is4() != ip.Is4():
			continue
		}
		cand := netip.AddrPortFrom(a, ep.Port())
		if p.Proto == 6 && p.DPort == ep.Port() {
			return cand, true
		}
		if !found {
			best, found = cand, true
		}
	}
	return best, found
}

// synSteps are the model's steps as explain prints them.
func synSteps(st *maps.State, now uint64, dst netip.AddrPort, v refmodel.SynVerdict, tr refmodel.SynTrace, wall time.Time) []string {
	if tr.Endpoint == nil {
		return []string{fmt.Sprintf("endpoint %v: not protected", dst)}
	}
	svc := tr.Service
	ep := dst.String()
	if tr.Endpoint.Addr == ([16]byte{}) {
		ep = fmt.Sprintf("any address, port %d", dst.Port())
	}
	steps := []string{fmt.Sprintf("endpoint %s: service %d, %s", ep, v.Service, maps.SynModeName(maps.SynMode(svc.Mode)))}
	if !v.Protected {
		return append(steps, "protection off: to the limiter")
	}
	if tr.Denied {
		return append(steps, "lists: the source is deny-listed: dropped (deny)")
	}
	switch maps.SynMode(svc.Mode) {
	case maps.SynAuto:
		onoff := "not on"
		if tr.Active {
			onoff = "on"
		}
		before := uint64(0) // a SYN in a new rate window starts its count
		if tr.State.Win == now>>loader.SyncookieEgSynSizesEG_SYN_RATE_SHIFT {
			before = tr.State.Syns
		}
		steps = append(steps, fmt.Sprintf("auto: %d SYNs in this rate window before this one (on at %d, off under %d for %v): %s",
			before, svc.OnSyns, svc.OffSyns, time.Duration(svc.HoldNs), onoff))
	case maps.SynMonitor:
		steps = append(steps, "monitor: counted, never answered")
	case maps.SynAlways:
		steps = append(steps, "always: on")
	}
	switch {
	case svc.ValidatedNs == 0:
		steps = append(steps, "validated_for 0: no bypass")
	case tr.Standing == nil:
		steps = append(steps, "standing: no entry: no bypass")
	default:
		e := tr.Standing
		s := fmt.Sprintf("standing: %s since %s", maps.StandingName(maps.Standing(e.Standing)),
			st.WallTime(e.Since, wall).UTC().Format(time.RFC3339))
		if tr.Bypass {
			s += fmt.Sprintf(", within validated_for %v: bypass", time.Duration(svc.ValidatedNs))
		} else {
			s += ": no bypass"
		}
		steps = append(steps, s)
	}
	if tr.AnswerKey != nil {
		a, b := tr.AnswersLeft(now)
		steps = append(steps, fmt.Sprintf("answer budget of %s: %.4g of %.4g left", tr.AnswerPrefix(), a, b))
	}
	return append(steps, fmt.Sprintf("%s (%s)", refmodel.SynActionName(v.Action), refmodel.SynCounterName(v.Reason)))
}

// synSegmentNext is the model's verdict on the probe's segment (flags
// other than a bare SYN, asked as belonging to no connection).
func synSegmentNext(v refmodel.SynVerdict, flags uint8) string {
	s := fmt.Sprintf("a segment with flags %#02x that belongs to no connection here ", flags)
	switch v.Reason {
	case loader.SyncookieEgSynCounterEG_SYNC_DENY:
		return s + "is dropped: the source is deny-listed (deny)"
	case loader.SyncookieEgSynCounterEG_SYNC_OOS_BUDGET:
		return s + "passes to the limiter within the service's out-of-state budget (out_of_state_pass)"
	}
	what := "is dropped"
	if v.Action == refmodel.SynContinue {
		what = "passes to the limiter and the kernel (protection not on, or monitor), counted"
	}
	if v.Reason == loader.SyncookieEgSynCounterEG_SYNC_COOKIE_INVALID {
		return fmt.Sprintf("%s%s as an ACK without a valid cookie (cookie_invalid)", s, what)
	}
	return fmt.Sprintf("%s%s as out of state (%s)", s, what, refmodel.SynCounterName(v.Reason))
}

// synNext is the model's verdict in a sentence.
func synNext(v refmodel.SynVerdict, tr refmodel.SynTrace, until *time.Time, pfx netip.Prefix) string {
	if !v.Protected {
		return "passes to the limiter: protection off"
	}
	switch v.Reason {
	case loader.SyncookieEgSynCounterEG_SYNC_DENY:
		return "dropped: the source is deny-listed (deny)"
	case loader.SyncookieEgSynCounterEG_SYNC_VALIDATED_PASS:
		s := "passes to the limiter and the kernel: validated source, no cookie"
		if until != nil {
			s += " until " + until.UTC().Format(time.RFC3339)
		}
		return s + " (validated_pass)"
	case loader.SyncookieEgSynCounterEG_SYNC_WOULD_ANSWER:
		if maps.SynMode(tr.Service.Mode) == maps.SynMonitor {
			return "passes to the limiter and the kernel: monitor mode (would_answer)"
		}
		return "passes to the limiter and the kernel: protection not on now (would_answer)"
	case loader.SyncookieEgSynCounterEG_SYNC_ANSWER_LIMITED:
		return fmt.Sprintf("dropped: the answer budget of %s is spent (answer_limited)", pfx)
	case loader.SyncookieEgSynCounterEG_SYNC_ANSWERED:
		return "answered in XDP with a SYN-ACK carrying a cookie (answered)"
	}
	return fmt.Sprintf("%s (%s)", refmodel.SynActionName(v.Action), refmodel.SynCounterName(v.Reason))
}
