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

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/policy"
)

type peerUIDKey struct{}

// serveControl serves the control API on the Unix socket, root only: the
// socket is mode 0600 in a 0700 directory, and every connection's peer
// credentials are checked as well.
func (d *Daemon) serveControl(ctx context.Context) error {
	if d.opts.Socket == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(d.opts.Socket), 0o700); err != nil {
		return fmt.Errorf("create socket dir: %w", err)
	}
	if err := os.Remove(d.opts.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", d.opts.Socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", d.opts.Socket, err)
	}
	if err := os.Chmod(d.opts.Socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("restrict socket: %w", err)
	}
	srv := &http.Server{
		Handler:           d.rootOnly(d.controlMux()),
		ReadHeaderTimeout: 5 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, peerUIDKey{}, peerUID(c))
		},
	}
	go func() {
		<-ctx.Done()
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
		writeJSON(w, d.top.report(time.Now(), window, n))
	})
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
		if err := json.NewDecoder(r.Body).Decode(&ch); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("decode list change: %w", err))
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
		if err := d.RemoveFromList(kind, p); err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/asn", func(w http.ResponseWriter, r *http.Request) {
		ip, err := netip.ParseAddr(r.URL.Query().Get("ip"))
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("bad ip: %w", err))
			return
		}
		writeJSON(w, d.LookupASN(ip.Unmap()))
	})
	return mux
}

func listKind(r *http.Request) (control.ListKind, error) {
	switch k := control.ListKind(r.PathValue("kind")); k {
	case control.Deny, control.Allow:
		return k, nil
	}
	return "", fmt.Errorf("unknown list %q: use deny or allow", r.PathValue("kind"))
}

func (d *Daemon) policyChange(w http.ResponseWriter, r *http.Request, apply bool) {
	var doc control.PolicyDoc
	if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("decode policy: %w", err))
		return
	}
	source := doc.Source
	if source == "" {
		source = "policy"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	next, err := d.prepare(r.Context(), []byte(doc.YAML), source)
	if err != nil {
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
	change := control.PolicyChange{Diff: policy.FormatDiff(policy.Diff(d.cur.compiled, next.compiled)), Generation: d.generation}
	if !apply {
		writeJSON(w, change)
		return
	}
	if d.opts.ConfigPath == "" {
		writeError(w, http.StatusConflict, errors.New("the daemon runs the built-in policy (no --config): "+
			"start it with --config FILE to change the policy at run time"))
		return
	}
	// Apply first, then make it the configuration: a policy the data
	// plane refused never reaches the file.
	next.source = d.opts.ConfigPath
	if err := d.commit(next, "api"); err != nil {
		d.failLocked(err, "api")
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if err := d.syncAttachments(); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if err := d.syncL7(context.WithoutCancel(r.Context())); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if err := writeFileAtomic(d.opts.ConfigPath, []byte(doc.YAML)); err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("policy applied, but saving it to %s failed: %w", d.opts.ConfigPath, err))
		return
	}
	change.Applied, change.Generation = true, d.generation
	writeJSON(w, change)
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".edgeguard-policy-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Status describes the daemon for `edgectl status`.
func (d *Daemon) Status() control.Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := control.Status{
		Version: d.opts.Version, Policy: d.cur.source, Generation: d.generation, LastReload: d.lastReload,
		Mode: string(d.cur.pol.Mode), Clock: string(d.cur.pol.Clock), PinDir: d.opts.PinDir,
	}
	if d.asnTable != nil {
		st.ASNEntries = d.asnTable.Len()
	}
	st.DataGen, _ = d.m.ActiveGen()
	st.IPv4Direct = ipv4DirectInfo(d.m.V4Direct())
	st.Congestion = d.standing.status(time.Now())
	for name, a := range d.atts {
		st.Interfaces = append(st.Interfaces, control.Interface{Name: name, Ifindex: a.Ifindex, XDPMode: string(a.Mode)})
	}
	slices.SortFunc(st.Interfaces, func(a, b control.Interface) int { return strings.Compare(a.Name, b.Name) })
	if info, err := d.dp.Objects.XdpLimiter.Info(); err == nil {
		if id, ok := info.ID(); ok {
			st.ProgramID = uint32(id)
		}
	}
	occ, _ := d.m.Tables()
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
	for p, e := range d.dyn[kind] {
		if !e.expires.IsZero() && !e.expires.After(now) {
			continue
		}
		le := control.ListEntry{Prefix: p, Origin: e.origin, Reason: e.reason}
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
	e := dynEntry{origin: origin, reason: ch.Reason}
	if ch.TTL > 0 {
		e.expires = time.Now().Add(time.Duration(ch.TTL))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prev, had := d.dyn[kind][p]
	d.dyn[kind][p] = e
	if err := d.syncLists(); err != nil {
		if had {
			d.dyn[kind][p] = prev
		} else {
			delete(d.dyn[kind], p)
		}
		return control.ListEntry{}, err
	}
	if err := d.saveLists(); err != nil {
		d.log.Error("list entry added but not saved: a restart forgets it", "err", err)
	}
	d.log.Info("list entry added", "list", kind, "prefix", p, "ttl", time.Duration(ch.TTL), "origin", origin)
	le := control.ListEntry{Prefix: p, Origin: origin, Reason: ch.Reason}
	if !e.expires.IsZero() {
		le.Expires = &e.expires
	}
	return le, nil
}

// RemoveFromList removes a run-time entry. Entries of the policy file are
// changed in the file.
func (d *Daemon) RemoveFromList(kind control.ListKind, p netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p = p.Masked()
	prev, ok := d.dyn[kind][p]
	if !ok {
		for _, e := range d.cur.pol.Deny {
			if kind == control.Deny && e.Prefix.Masked() == p {
				return fmt.Errorf("%s is in the policy file (%s): remove it there", p, e.Source)
			}
		}
		for _, e := range d.cur.pol.Allow {
			if kind == control.Allow && e.Prefix.Masked() == p {
				return fmt.Errorf("%s is in the policy file (%s): remove it there", p, e.Source)
			}
		}
		return fmt.Errorf("%s is not on the %s list", p, kind)
	}
	delete(d.dyn[kind], p)
	if err := d.syncLists(); err != nil {
		d.dyn[kind][p] = prev
		return err
	}
	if err := d.saveLists(); err != nil {
		d.log.Error("list entry removed but not saved: a restart brings it back", "err", err)
	}
	d.log.Info("list entry removed", "list", kind, "prefix", p)
	return nil
}

// LookupASN tells what the data plane knows about an address.
func (d *Daemon) LookupASN(ip netip.Addr) control.ASNInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := control.ASNInfo{IP: ip, Rule: d.cur.names[0]}
	var e asn.Entry
	if d.asnTable != nil {
		e, out.Found = d.asnTable.Lookup(ip)
	}
	if out.Found {
		out.Prefix, out.ASN, out.Country = e.Prefix, e.ASN, asn.CountryString(e.Country)
	}
	// The rule is what the compiled prefix facts say, most specific first.
	best := -1
	for _, f := range d.cur.compiled.Prefixes {
		if f.Prefix.Contains(ip) && f.Prefix.Bits() > best {
			best = f.Prefix.Bits()
			out.Rule = d.cur.names[f.RuleID]
		}
	}
	return out
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
