package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/fleet"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
	"github.com/edgeguard/edgeguard/internal/policy"
)

type peerUIDKey struct{}

// Request body bounds of the control API: a policy document (the YAML
// text inline; large prefix lists belong in list files, which the daemon
// reads itself) and everything else, a few hundred bytes in practice.
const (
	maxPolicyBody = 16 << 20
	maxSmallBody  = 64 << 10
)

// listenControl binds the control socket, root only: mode 0600 in a 0700
// directory (every connection's peer credentials are checked as well). A
// socket another daemon still answers on is refused, not stolen.
func listenControl(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("control socket %s: another edgectl run answers on it: stop it first, or pass another --socket", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restrict socket: %w", err)
	}
	return ln, nil
}

// serveControl serves the control API on the socket bound at start.
func (d *Daemon) serveControl(ctx context.Context) error {
	ln := d.controlLn
	if ln == nil {
		return nil
	}
	srv := &http.Server{
		Handler:           d.rootOnly(d.controlMux()),
		ReadHeaderTimeout: 5 * time.Second,
		MaxHeaderBytes:    maxSmallBody,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, peerUIDKey{}, peerUID(c))
		},
	}
	go func() {
		<-ctx.Done()
		// A policy change in progress finishes and its caller gets the
		// answer (applied or not) before the socket closes; changes asked
		// for from now on are refused. Bounded: a change stuck longer
		// (ASN data that never arrives) is cut off, and its caller is told
		// the outcome is unknown.
		d.waitForChange(changeWaitAtStop)
		d.capture.close() // capture streams end, so Shutdown finds them idle
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	d.log.Info("control socket listening", "path", d.opts.Socket)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	os.Remove(d.opts.Socket)
	return nil
}

// changeWaitAtStop bounds how long a stopping daemon waits for a policy
// change in progress to finish and answer.
const changeWaitAtStop = 30 * time.Second

// waitForChange waits (at most limit) for a policy change in progress to
// finish, then marks the daemon stopping so no other starts.
func (d *Daemon) waitForChange(limit time.Duration) {
	deadline := time.Now().Add(limit)
	logged := false
	for !d.changeMu.TryLock() {
		if time.Now().After(deadline) {
			d.log.Error("stopping: the policy change in progress did not finish; its caller is told the outcome is unknown",
				"waited", limit)
			return
		}
		if !logged {
			d.log.Info("stopping: waiting for the policy change in progress to finish and answer", "at_most", limit)
			logged = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.stopping = true
	d.changeMu.Unlock()
}

// decodeBody decodes a JSON request body of at most limit bytes; a larger
// one is refused with 413 before it is read whole.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, what string, v any) bool {
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s: %d bytes, at most %d", what, r.ContentLength, limit))
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s: more than %d bytes", what, limit))
			return false
		}
		writeError(w, http.StatusBadRequest, fmt.Errorf("decode %s: %w", what, err))
		return false
	}
	return true
}

func (d *Daemon) rootOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if uid, _ := r.Context().Value(peerUIDKey{}).(int); uid != 0 {
			writeError(w, http.StatusForbidden, fmt.Errorf("the control socket is root-only (caller uid %d): run edgectl with sudo", uid))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (d *Daemon) controlMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, d.Status())
	})
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		st, err := d.Stats()
		if err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("GET /v1/top", func(w http.ResponseWriter, r *http.Request) {
		window, n := time.Minute, 10
		if s := r.URL.Query().Get("window"); s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v <= 0 {
				writeError(w, http.StatusBadRequest, fmt.Errorf("bad window %q: use a duration such as 30s", s))
				return
			}
			window = v
		}
		if s := r.URL.Query().Get("n"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v <= 0 {
				writeError(w, http.StatusBadRequest, fmt.Errorf("bad n %q: use a positive number", s))
				return
			}
			n = v
		}
		names := d.ruleNames()
		bySlot := map[uint32]string{}
		if slots, err := d.m.Generations.RuleSlots(); err == nil {
			for id, slot := range slots {
				bySlot[slot] = names[id]
			}
		}
		writeJSON(w, d.top.report(time.Now(), window, n, func(slot uint32) string { return bySlot[slot] }))
	})
	mux.HandleFunc("POST /v1/capture", d.capture.serve)
	mux.HandleFunc("GET /v1/policy", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		doc := control.PolicyDoc{Source: d.cur.source, Generation: d.generation, YAML: string(d.cur.raw)}
		d.mu.Unlock()
		writeJSON(w, doc)
	})
	mux.HandleFunc("POST /v1/policy/diff", func(w http.ResponseWriter, r *http.Request) {
		d.policyChange(w, r, false)
	})
	mux.HandleFunc("POST /v1/policy", func(w http.ResponseWriter, r *http.Request) {
		d.policyChange(w, r, true)
	})
	mux.HandleFunc("GET /v1/lists/{kind}", func(w http.ResponseWriter, r *http.Request) {
		kind, err := listKind(r)
		if err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		writeJSON(w, d.ListEntries(kind))
	})
	mux.HandleFunc("POST /v1/lists/{kind}", func(w http.ResponseWriter, r *http.Request) {
		kind, err := listKind(r)
		if err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		var ch control.ListChange
		if !decodeBody(w, r, maxSmallBody, "list change", &ch) {
			return
		}
		e, err := d.AddToList(kind, ch)
		if err != nil {
			writeError(w, http.StatusUnprocessableEntity, err)
			return
		}
		writeJSON(w, e)
	})
	mux.HandleFunc("DELETE /v1/lists/{kind}", func(w http.ResponseWriter, r *http.Request) {
		kind, err := listKind(r)
		if err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		p, err := policy.ParsePrefix(r.URL.Query().Get("prefix"))
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("bad prefix: %w", err))
			return
		}
		notSaved, err := d.RemoveFromList(kind, p)
		if err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		if notSaved != "" {
			writeJSON(w, control.ListEntry{Prefix: p.Masked(), NotSaved: notSaved})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	d.explainRoutes(mux)
	d.replayRoutes(mux)
	d.rlsRoutes(mux)
	d.fleetRoutes(mux)
	d.shieldRoutes(mux)
	d.inventoryRoutes(mux)
	d.bgpRoutes(mux)
	return mux
}

func listKind(r *http.Request) (control.ListKind, error) {
	switch k := control.ListKind(r.PathValue("kind")); k {
	case control.Deny, control.Allow:
		return k, nil
	}
	return "", fmt.Errorf("unknown list %q: use deny or allow", r.PathValue("kind"))
}

// policyChange diffs (apply false) or applies a policy document. The
// daemon's state lock is not held while the policy is parsed or its ASN
// data loaded: only changeMu, which serializes changes.
func (d *Daemon) policyChange(w http.ResponseWriter, r *http.Request, apply bool) {
	var doc control.PolicyDoc
	if !decodeBody(w, r, maxPolicyBody, "policy", &doc) {
		return
	}
	source := doc.Source
	if source == "" {
		source = "policy"
	}
	d.changeMu.Lock()
	defer d.changeMu.Unlock()
	if d.stopping {
		writeError(w, http.StatusServiceUnavailable, errors.New("the daemon is stopping: nothing was changed"))
		return
	}
	ctx := context.WithoutCancel(r.Context())
	next, err := d.prepareAnySize(ctx, []byte(doc.YAML), source)
	if err != nil {
		if apply {
			d.fail(err, "api")
		}
		var ve *policy.ValidationError
		if errors.As(err, &ve) {
			e := control.Error{Error: fmt.Sprintf("invalid policy %s: %d problem(s)", source, len(ve.Problems))}
			for _, p := range ve.Problems {
				e.Problems = append(e.Problems, p.String())
			}
			writeJSONStatus(w, http.StatusUnprocessableEntity, e)
			return
		}
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	d.mu.Lock()
	cur, gen := d.cur, d.generation
	d.mu.Unlock()
	// With --iface the flags name the interfaces, whatever either policy
	// says: the diff leaves interfaces out, and says so when the file's
	// differ.
	from, to := cur.pol, next.pol
	cfrom, cto := cur.compiled, next.compiled
	var warnings []string
	if len(d.opts.Ifaces) > 0 {
		a, b := *from, *to
		a.Interfaces, b.Interfaces = nil, nil
		from, to = &a, &b
		ca, cb := *cfrom, *cto
		ca.Interfaces, cb.Interfaces = nil, nil
		cfrom, cto = &ca, &cb
		var names []string
		for _, i := range next.pol.Interfaces {
			names = append(names, i.Name)
		}
		if !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(d.opts.Ifaces))) {
			warnings = append(warnings, fmt.Sprintf("the daemon runs with --iface %s: the file's interfaces: [%s] are not used "+
				"(restart the daemon without --iface to use them)", strings.Join(d.opts.Ifaces, ","), strings.Join(names, ",")))
		}
	}
	sizesErr := d.checkSizes(next.pol.Tables)
	if sizesErr != nil && !apply {
		warnings = append(warnings, "applying it is refused: "+sizesErr.Error())
	}
	changes := append(policy.DiffSections(from, to, rls.DiffL7), policy.Diff(cfrom, cto)...)
	change := control.PolicyChange{Diff: policy.FormatDiff(changes), Changes: len(changes), Generation: gen,
		Warning: strings.Join(warnings, "; ")}
	if !apply {
		writeJSON(w, change)
		return
	}
	if sizesErr != nil {
		d.fail(sizesErr, "api")
		writeError(w, http.StatusUnprocessableEntity, sizesErr)
		return
	}
	// The applied policy is kept in the state directory, never written
	// over the operator's config file: written and synced before the
	// apply, put in place after it.
	var pending *pendingFile
	saved := appliedPolicy{Source: source, AppliedAt: time.Now().UTC(), ConfigPath: d.opts.ConfigPath,
		ConfigSHA256: sha256Hex(d.fileRaw), YAML: doc.YAML}
	if path := d.statePath(appliedFile); path != "" {
		data, err := json.MarshalIndent(saved, "", "  ")
		if err == nil {
			pending, err = prepareFile(path, data, 0o600)
		}
		if err != nil {
			err = fmt.Errorf("policy not applied: save it to the state directory: %w", err)
			d.fail(err, "api")
			writeError(w, http.StatusInternalServerError, err)
			return
		}
	}
	if err := d.apply(ctx, next, "api"); err != nil {
		if pending != nil {
			pending.abort()
		}
		d.fail(err, "api")
		writeError(w, http.StatusUnprocessableEntity, fmt.Errorf("policy not applied, nothing changed: %w", err))
		return
	}
	d.applied = &saved
	origin := fmt.Sprintf("applied with 'edgectl policy apply' at %s", saved.AppliedAt.Format(time.RFC3339))
	if pending != nil {
		if err := pending.commit(); err != nil {
			origin += "; not saved, a restart runs the config file"
			d.log.Error("policy applied but not saved: a restart runs the config file", "err", err)
			warnings = append(warnings, fmt.Sprintf("applied, but not saved (%v): a restart runs the config file", err))
		}
	} else {
		origin += "; no --state-dir, a restart runs the config file"
		warnings = append(warnings, "applied, but the daemon has no --state-dir: a restart runs the config file")
	}
	d.mu.Lock()
	d.origin = origin
	change.Applied, change.Generation = true, d.generation
	for _, p := range d.lastReload.Problems {
		warnings = append(warnings, "applied, but not followed by "+p)
	}
	d.mu.Unlock()
	change.Warning = strings.Join(warnings, "; ")
	writeJSON(w, change)
}

// Status describes the daemon for `edgectl status`.
func (d *Daemon) Status() control.Status {
	problems := d.unprotectedIfaces() // takes mu itself
	d.mu.Lock()
	defer d.mu.Unlock()
	st := control.Status{
		Version: d.opts.Build.Version, Build: d.opts.Build, Policy: d.cur.source, PolicyOrigin: d.origin, Generation: d.generation,
		LastReload: d.lastReload, Mode: string(d.cur.pol.Mode), Clock: string(d.cur.pol.Clock), PinDir: d.opts.PinDir,
		StateDir: d.opts.StateDir, Started: d.started, UptimeSeconds: int64(time.Since(d.started).Seconds()),
		StateNotSaved: d.lists.notSaved(),
	}
	if d.metricsLn != nil {
		st.MetricsAddr = d.metricsLn.Addr().String()
	}
	if d.cur.asn != nil {
		st.ASNEntries = d.cur.asn.Len()
	}
	st.DataGen, _ = d.m.Generations.Active()
	st.IPv4Direct = ipv4DirectInfo(d.m.Generations.V4Direct())
	st.Congestion = d.standing.status(time.Now())
	st.CongestedInstances = d.standing.instanceStatus(time.Now())
	st.L7 = d.l7.status()
	for name, a := range d.atts {
		st.Interfaces = append(st.Interfaces, control.Interface{Name: name, Ifindex: a.Ifindex, XDPMode: string(a.Mode),
			Problem: problems[name]})
		delete(problems, name)
	}
	for name, why := range problems { // named by the policy, not attached
		st.Interfaces = append(st.Interfaces, control.Interface{Name: name, Problem: why})
	}
	slices.SortFunc(st.Interfaces, func(a, b control.Interface) int { return strings.Compare(a.Name, b.Name) })
	if info, err := d.dp.Objects.XdpLimiter.Info(); err == nil {
		if id, ok := info.ID(); ok {
			st.ProgramID = uint32(id)
		}
	}
	occ, _ := d.m.Counters.Tables()
	o := &d.dp.Objects
	for _, m := range []struct {
		name, table string
		m           *ebpf.Map
	}{
		{"src_buckets", "sources", o.SrcBuckets}, {"agg_buckets", "aggregates", o.AggBuckets},
		{"whole_buckets", "", o.WholeBuckets},
		{"lists", "lists", o.Lists}, {"prefix_gens", "", o.PrefixGens}, {"rules", "", o.Rules},
		{"l4_rules", "", o.L4Rules}, {"stats", "", o.Stats}, {"samples", "", o.Samples},
		{"standing", "standing", o.Standing}, {"known_good", "", o.KnownGood},
	} {
		mi := control.MapInfo{Name: m.name, Capacity: int(m.m.MaxEntries())}
		if info, err := m.m.Info(); err == nil {
			if id, ok := info.ID(); ok {
				mi.ID = uint32(id)
			}
		}
		if m.table != "" {
			mi.Entries = occ[m.table].Entries
		}
		st.Maps = append(st.Maps, mi)
	}
	return st
}

// ListEntries returns a list as the operator sees it: the policy's entries
// and those added at run time, with their origin.
func (d *Daemon) ListEntries(kind control.ListKind) []control.ListEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []control.ListEntry
	src := d.cur.pol.Deny
	if kind == control.Allow {
		src = d.cur.pol.Allow
	}
	for _, e := range src {
		le := control.ListEntry{Prefix: e.Prefix, Origin: "policy", Reason: e.Source}
		if !e.Expires.IsZero() {
			t := e.Expires
			le.Expires = &t
		}
		out = append(out, le)
	}
	now := time.Now()
	for p, e := range d.lists.dyn[kind] {
		if !e.expires.IsZero() && !e.expires.After(now) {
			continue
		}
		le := control.ListEntry{Prefix: p, Origin: e.origin, Reason: e.reason, Host: e.host}
		if !e.expires.IsZero() {
			t := e.expires
			le.Expires = &t
		}
		out = append(out, le)
	}
	slices.SortFunc(out, func(a, b control.ListEntry) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
	return out
}

// AddToList adds (or refreshes) a run-time entry and writes the lists.
func (d *Daemon) AddToList(kind control.ListKind, ch control.ListChange) (control.ListEntry, error) {
	if !ch.Prefix.IsValid() {
		return control.ListEntry{}, errors.New("missing prefix")
	}
	if ch.TTL < 0 {
		return control.ListEntry{}, errors.New("ttl must be positive")
	}
	origin := ch.Origin
	switch origin {
	case "":
		origin = "cli"
	case "cli", "l7":
	default:
		return control.ListEntry{}, fmt.Errorf("unknown origin %q: use cli or l7", origin)
	}
	p := ch.Prefix.Masked()
	if ch.Force && origin != "cli" {
		return control.ListEntry{}, errors.New("force is for the operator's cli entries only")
	}
	if !ch.Force {
		if err := checkWidth(kind, p); err != nil {
			return control.ListEntry{}, err
		}
	}
	e := dynEntry{origin: origin, reason: ch.Reason}
	if ch.TTL > 0 {
		e.expires = time.Now().Add(time.Duration(ch.TTL))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if kind == control.Deny && !ch.Force {
		if err := d.checkProtected(p); err != nil {
			return control.ListEntry{}, err
		}
	}
	prev, had := d.lists.dyn[kind][p]
	if had && e.reason == "" {
		// Refreshing an entry (a new TTL) keeps why it was added.
		e.reason = prev.reason
	}
	d.lists.dyn[kind][p] = e
	if err := d.lists.sync(d.cur.pol); err != nil {
		if had {
			d.lists.dyn[kind][p] = prev
		} else {
			delete(d.lists.dyn[kind], p)
		}
		return control.ListEntry{}, err
	}
	var notSaved string
	if err := d.lists.save(); err != nil {
		notSaved = err.Error()
		d.log.Error("list entry added and in force, but not saved: a restart forgets it", "list", kind, "prefix", p, "err", err)
	}
	d.fleet.publishList(fleet.OpAdd, kind, p, e)
	d.log.Info("list entry added", "list", kind, "prefix", p, "ttl", time.Duration(ch.TTL), "origin", origin,
		"reason", e.reason, "forced", ch.Force, "refreshed", had)
	le := control.ListEntry{Prefix: p, Origin: origin, Reason: e.reason, NotSaved: notSaved}
	if !e.expires.IsZero() {
		le.Expires = &e.expires
	}
	return le, nil
}

// RemoveFromList removes a run-time entry. Entries of the policy file are
// changed in the file.
func (d *Daemon) RemoveFromList(kind control.ListKind, p netip.Prefix) (notSaved string, _ error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p = p.Masked()
	prev, ok := d.lists.dyn[kind][p]
	if !ok {
		for _, e := range d.cur.pol.Deny {
			if kind == control.Deny && e.Prefix.Masked() == p {
				return "", fmt.Errorf("%s is in the policy file (%s): remove it there", p, e.Source)
			}
		}
		for _, e := range d.cur.pol.Allow {
			if kind == control.Allow && e.Prefix.Masked() == p {
				return "", fmt.Errorf("%s is in the policy file (%s): remove it there", p, e.Source)
			}
		}
		return "", fmt.Errorf("%s is not on the %s list", p, kind)
	}
	delete(d.lists.dyn[kind], p)
	if err := d.lists.sync(d.cur.pol); err != nil {
		d.lists.dyn[kind][p] = prev
		return "", err
	}
	if err := d.lists.save(); err != nil {
		notSaved = err.Error()
		d.log.Error("list entry removed from the data plane, but not saved: a restart brings it back", "list", kind, "prefix", p, "err", err)
	}
	d.fleet.publishList(fleet.OpDel, kind, p, prev)
	d.log.Info("list entry removed", "list", kind, "prefix", p)
	return notSaved, nil
}

func writeJSON(w http.ResponseWriter, v any) { writeJSONStatus(w, http.StatusOK, v) }

func writeJSONStatus(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSONStatus(w, status, control.Error{Error: err.Error()})
}
