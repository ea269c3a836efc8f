package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// runLists are the run-time list entries (edgectl deny/allow, the L7
// stage's escalations, the fleet's shared entries): merged with the
// running policy's lists into the data plane's (maps.ListStore, which
// runLists alone writes), and saved in the state directory. They change
// only together with the policy they merge with, so the daemon's mu
// guards them: every method's caller holds it (expire takes it through
// locked).
type runLists struct {
	log *slog.Logger
	// store is the data plane's lists; nil before it loads.
	store *maps.ListStore
	// path is the lists file in the state directory; "" keeps the
	// entries in memory only.
	path string
	// locked runs a function under the daemon's mu with the running
	// policy.
	locked func(func(cur *policy.Policy))

	dyn map[control.ListKind]map[netip.Prefix]dynEntry
	// unsaved is why the run-time entries in force are not those in the
	// state directory (nil: saved), since unsavedAt; saveFailures counts
	// failed saves.
	unsaved      error
	unsavedAt    time.Time
	saveFailures uint64
	// corrupt: the start found a lists file that is not a list (set
	// aside); the entries come back from the pinned data plane (recover).
	corrupt bool
}

func newRunLists(log *slog.Logger, path string, locked func(func(cur *policy.Policy))) *runLists {
	return &runLists{log: log, path: path, locked: locked,
		dyn: map[control.ListKind]map[netip.Prefix]dynEntry{control.Deny: {}, control.Allow: {}}}
}

// entries are the data plane's list entries for policy p merged with the
// run-time entries, dropping expired run-time ones.
func (l *runLists) entries(p *policy.Policy) ([]maps.ListEntry, error) {
	deny := slices.Clone(p.Deny)
	allow := slices.Clone(p.Allow)
	now := time.Now()
	for kind, entries := range l.dyn {
		for pfx, e := range entries {
			if !e.expires.IsZero() && !e.expires.After(now) {
				delete(entries, pfx)
				continue
			}
			le := policy.ListEntry{Prefix: pfx, Expires: e.expires, Source: e.origin}
			if kind == control.Deny {
				deny = append(deny, le)
			} else {
				allow = append(allow, le)
			}
		}
	}
	return maps.ListEntries(policy.CompileLists(deny, allow))
}

// sync writes policy p's lists (the running policy's) merged with the
// run-time entries.
func (l *runLists) sync(p *policy.Policy) error {
	entries, err := l.entries(p)
	if err != nil {
		return err
	}
	if err := l.store.Set(entries); err != nil {
		return fmt.Errorf("write lists: %w", err)
	}
	return nil
}

// expire drops expired run-time list entries from the daemon's view
// every 10 seconds, and retries a failed save. The data plane already
// ignores them once past their expiry.
func (l *runLists) expire(ctx context.Context) error {
	return ticking(ctx, 10*time.Second, func() {
		l.locked(func(cur *policy.Policy) { l.expireOnce(cur) })
	})
}

// ticking runs f every interval until ctx ends.
func ticking(ctx context.Context, interval time.Duration, f func()) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			f()
		}
	}
}

// expireOnce is one tick of expire.
func (l *runLists) expireOnce(cur *policy.Policy) {
	expired := false
	now := time.Now()
	for _, entries := range l.dyn {
		for _, e := range entries {
			if !e.expires.IsZero() && !e.expires.After(now) {
				expired = true
			}
		}
	}
	if expired {
		if err := l.sync(cur); err != nil {
			l.log.Error("expire list entries", "err", err)
		}
	}
	// A save that failed (a full or read-only state directory)
	// is retried here until it succeeds.
	if expired || l.unsaved != nil {
		if err := l.save(); err != nil {
			l.log.Error("save list entries", "err", err)
		}
	}
}

// save writes the run-time entries.
func (l *runLists) save() error {
	path := l.path
	if path == "" {
		return nil
	}
	out := []savedEntry{}
	for kind, entries := range l.dyn {
		for p, e := range entries {
			out = append(out, savedEntry{List: kind, Prefix: p, Expires: e.expires, Origin: e.origin, Reason: e.reason, Host: e.host})
		}
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		err = fmt.Errorf("save run-time list entries: %w", err)
		l.saveFailures++
		if l.unsaved == nil {
			l.unsavedAt = time.Now()
		}
		l.unsaved = err
		return err
	}
	if l.unsaved != nil {
		l.log.Info("run-time list entries saved again", "file", path, "unsaved_since", l.unsavedAt)
	}
	l.unsaved = nil
	return nil
}

// listsNotSaved says why the run-time entries in force are not saved, for
// status; "" when they are.
func (l *runLists) notSaved() string {
	if l.unsaved == nil {
		return ""
	}
	return fmt.Sprintf("run-time list entries NOT saved since %s (a restart loses the changes since): %v",
		l.unsavedAt.UTC().Format(time.RFC3339), l.unsaved)
}

// loadLists reads the entries a previous run saved; expired ones are
// dropped. Each entry is decoded on its own: one that does not parse or
// makes no sense is skipped with an error naming it, the others load, and
// the file as it was is copied aside as lists.json.corrupt once the start
// succeeded (the next save rewrites lists.json without the bad entries). A
// file that is not a list at all (truncated, null) is set aside whole;
// start then recovers the run-time entries from the pinned data plane
// (recover). read is the daemon's state file reader (it sets a corrupt
// file aside); later runs a change once the start succeeded.
func (l *runLists) load(read func(name string, decode func([]byte) error) (bool, error), later func(func())) error {
	var raws []json.RawMessage
	ok, err := read(listsFile, func(b []byte) error {
		if string(bytes.TrimSpace(b)) == "null" {
			return errors.New("it holds null, not a list of entries")
		}
		return json.Unmarshal(b, &raws)
	})
	if err != nil {
		return err
	}
	if !ok {
		if l.path != "" {
			if _, serr := os.Stat(l.path); serr == nil {
				l.corrupt = true // present, and set aside (or about to be)
			}
		}
		return nil
	}
	now := time.Now()
	n, bad := 0, 0
	for i, raw := range raws {
		var e savedEntry
		err := json.Unmarshal(raw, &e)
		switch {
		case err != nil:
		case e.List != control.Deny && e.List != control.Allow:
			err = fmt.Errorf("unknown list %q", e.List)
		case !e.Prefix.IsValid():
			err = errors.New("no prefix")
		}
		if err != nil {
			bad++
			text := string(raw)
			if len(text) > 200 {
				text = text[:200] + "..."
			}
			l.log.Error("saved list entry skipped: it does not parse; the others load", "file", l.path,
				"entry", i, "text", text, "err", err)
			continue
		}
		if !e.Expires.IsZero() && !e.Expires.After(now) {
			continue
		}
		l.dyn[e.List][e.Prefix.Masked()] = dynEntry{expires: e.Expires, origin: e.Origin, reason: e.Reason, host: e.Host}
		n++
	}
	if bad > 0 {
		path := l.path
		later(func() {
			data, err := os.ReadFile(path)
			if err == nil {
				err = writeFileAtomic(path+".corrupt", data, 0o600)
			}
			if err != nil {
				l.log.Error("keep a copy of the lists file with the skipped entries", "err", err)
				return
			}
			l.log.Error("lists file had entries that do not parse: a copy is kept", "file", path,
				"copy", path+".corrupt", "skipped", bad)
		})
	}
	if n > 0 {
		l.log.Info("restored run-time list entries", "path", l.path, "entries", n)
	}
	return nil
}

// recoverLists, at a start whose lists file was set aside, takes the
// run-time entries the re-opened data plane still enforces as run-time
// entries again, instead of removing them: every deny (allow) in force that
// no policy deny (allow) entry covers. The data plane folds a covering
// entry into the more specific ones under it, so a recovered wide entry
// can also come back on a more specific prefix the policy lists (the same
// verdicts while both stand). The data plane keeps no reason nor origin: they come back as
// cli entries with the reason saying where they came from. Caller is
// start, after the data plane loaded and before pol is applied; later
// runs a change once the start succeeded.
func (l *runLists) recover(pol *policy.Policy, later func(func())) {
	have, err := l.store.All()
	if err != nil {
		l.log.Error("recover run-time list entries from the data plane", "err", err)
		return
	}
	mono, err := maps.MonoNow()
	if err != nil {
		l.log.Error("recover run-time list entries from the data plane", "err", err)
		return
	}
	wall := time.Now()
	covered := func(entries []policy.ListEntry, p netip.Prefix) bool {
		for _, e := range entries {
			if e.Prefix.Masked().Overlaps(p) && e.Prefix.Bits() <= p.Bits() {
				return true
			}
		}
		return false
	}
	n := 0
	for _, e := range have {
		for _, lk := range []struct {
			kind   control.ListKind
			until  uint64
			policy []policy.ListEntry
		}{{control.Deny, e.DenyUntil, pol.Deny}, {control.Allow, e.AllowUntil, pol.Allow}} {
			if lk.until == 0 || (lk.until != maps.Forever && lk.until <= mono) || covered(lk.policy, e.Prefix) {
				continue
			}
			if _, ok := l.dyn[lk.kind][e.Prefix]; ok {
				continue
			}
			de := dynEntry{origin: "cli", reason: "recovered from the data plane: " + listsFile + " was corrupt"}
			if lk.until != maps.Forever {
				de.expires = wall.Add(time.Duration(lk.until - mono))
			}
			l.dyn[lk.kind][e.Prefix] = de
			n++
		}
	}
	l.log.Warn("lists file set aside: run-time entries recovered from the pinned data plane (reasons and origins are lost)",
		"file", l.path, "entries", n)
	// Saved once the start succeeded (after the corrupt file was set
	// aside), so a restart keeps them.
	later(func() {
		l.locked(func(*policy.Policy) {
			if err := l.save(); err != nil {
				l.log.Error("save the recovered list entries", "err", err)
			}
		})
	})
}
