package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

// listsFile holds the list entries added at run time, so a restarted daemon
// keeps them. It lives beside the control socket (/run/edgeguard, a tmpfs):
// like the pinned maps, it survives a daemon restart but not a reboot.
const listsFile = "lists.json"

type savedEntry struct {
	List    control.ListKind `json:"list"`
	Prefix  netip.Prefix     `json:"prefix"`
	Expires time.Time        `json:"expires,omitzero"`
	Origin  string           `json:"origin"`
	Reason  string           `json:"reason,omitempty"`
}

func (d *Daemon) statePath() string {
	if d.opts.StateDir == "" {
		return ""
	}
	return filepath.Join(d.opts.StateDir, listsFile)
}

// saveLists writes the run-time entries. Caller holds d.mu.
func (d *Daemon) saveLists() error {
	path := d.statePath()
	if path == "" {
		return nil
	}
	var out []savedEntry
	for kind, entries := range d.dyn {
		for p, e := range entries {
			out = append(out, savedEntry{List: kind, Prefix: p, Expires: e.expires, Origin: e.origin, Reason: e.reason})
		}
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	if err := writeFileAtomic(path, data); err != nil {
		return fmt.Errorf("save run-time list entries: %w", err)
	}
	return nil
}

// loadLists reads the entries a previous run saved; expired ones are
// dropped.
func (d *Daemon) loadLists() error {
	path := d.statePath()
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read saved list entries: %w", err)
	}
	var in []savedEntry
	if err := json.Unmarshal(data, &in); err != nil {
		return fmt.Errorf("read saved list entries %s: %w (delete the file to start without them)", path, err)
	}
	now := time.Now()
	for _, e := range in {
		if e.List != control.Deny && e.List != control.Allow {
			continue
		}
		if !e.Expires.IsZero() && !e.Expires.After(now) {
			continue
		}
		d.dyn[e.List][e.Prefix.Masked()] = dynEntry{expires: e.Expires, origin: e.Origin, reason: e.Reason}
	}
	if len(in) > 0 {
		d.log.Info("restored run-time list entries", "path", path, "entries", len(in))
	}
	return nil
}
