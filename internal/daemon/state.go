package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
)

// The state directory (--state-dir, /var/lib/edgeguard under systemd's
// StateDirectory=) keeps what must outlive the daemon and a reboot: the
// list entries added at run time and the policy applied with 'edgectl
// policy apply'. Every file is written atomically (temporary file, fsync,
// rename, fsync of the directory); a file that does not parse is reported,
// moved aside as FILE.corrupt and the daemon starts without it, keeping the
// others.
const (
	listsFile   = "lists.json"
	appliedFile = "applied-policy.json"
)

type savedEntry struct {
	List    control.ListKind `json:"list"`
	Prefix  netip.Prefix     `json:"prefix"`
	Expires time.Time        `json:"expires,omitzero"`
	Origin  string           `json:"origin"`
	Reason  string           `json:"reason,omitempty"`
	Host    string           `json:"host,omitempty"`
}

// appliedPolicy is a policy applied through the control socket. It runs
// instead of the config file as long as the config file's content is what
// it was when the policy was applied (ConfigSHA256): an edit of the file
// supersedes it.
type appliedPolicy struct {
	Source       string    `json:"source"` // the file the operator applied (list files resolve beside it)
	AppliedAt    time.Time `json:"applied_at"`
	ConfigPath   string    `json:"config_path"`   // the daemon's --config at the time
	ConfigSHA256 string    `json:"config_sha256"` // of the config file's content at the time
	YAML         string    `json:"yaml"`
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (d *Daemon) statePath(name string) string {
	if d.opts.StateDir == "" {
		return ""
	}
	return filepath.Join(d.opts.StateDir, name)
}

// pendingFile is a file written and synced under a temporary name, put in
// place by commit or removed by abort.
type pendingFile struct{ tmp, path string }

// prepareFile writes data beside path under a temporary name and syncs it.
func prepareFile(path string, data []byte, mode os.FileMode) (*pendingFile, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	fail := func(err error) (*pendingFile, error) {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	return &pendingFile{tmp: tmp.Name(), path: path}, nil
}

func (p *pendingFile) commit() error {
	if err := os.Rename(p.tmp, p.path); err != nil {
		os.Remove(p.tmp)
		return fmt.Errorf("write %s: %w", p.path, err)
	}
	// The rename is durable once the directory is synced.
	if dir, err := os.Open(filepath.Dir(p.path)); err == nil {
		dir.Sync()
		dir.Close()
	}
	return nil
}

func (p *pendingFile) abort() { os.Remove(p.tmp) }

// writeFileAtomic replaces path with data: a crash leaves the old file or
// the new one, never a mix.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	p, err := prepareFile(path, data, mode)
	if err != nil {
		return err
	}
	return p.commit()
}

// readStateFile reads a state file; one that exists but fails decode is
// moved aside as FILE.corrupt with an error in the log, and reads as
// absent, so one damaged file never costs the others or the start.
func (d *Daemon) readStateFile(name string, decode func([]byte) error) (bool, error) {
	path := d.statePath(name)
	if path == "" {
		return false, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read state file: %w", err)
	}
	if err := decode(data); err != nil {
		aside := path + ".corrupt"
		setAside := func() error {
			if rerr := os.Rename(path, aside); rerr != nil {
				return fmt.Errorf("state file %s does not parse (%w) and could not be moved aside: %w", path, err, rerr)
			}
			return nil
		}
		if d.starting {
			// The file is moved aside only once the start succeeded; a
			// start that fails leaves it where it is.
			d.afterStart = append(d.afterStart, func() {
				if rerr := setAside(); rerr != nil {
					d.log.Error("set aside a corrupt state file", "err", rerr)
				}
			})
			d.log.Error("state file does not parse: starting without it; moved aside once the start succeeds",
				"file", path, "moved_to", aside, "err", err)
			return false, nil
		}
		if rerr := setAside(); rerr != nil {
			return false, rerr
		}
		d.log.Error("state file does not parse: moved aside, starting without it", "file", path, "moved_to", aside, "err", err)
		return false, nil
	}
	return true, nil
}

// loadApplied reads the policy a previous 'edgectl policy apply' saved.
func (d *Daemon) loadApplied() (*appliedPolicy, error) {
	var a appliedPolicy
	ok, err := d.readStateFile(appliedFile, func(b []byte) error {
		if err := json.Unmarshal(b, &a); err != nil {
			return err
		}
		if a.YAML == "" || a.ConfigSHA256 == "" {
			return errors.New("no policy in it")
		}
		return nil
	})
	if err != nil || !ok {
		return nil, err
	}
	return &a, nil
}

// dropApplied removes the saved applied policy: the config file runs again.
func (d *Daemon) dropApplied() {
	path := d.statePath(appliedFile)
	if path == "" {
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.log.Error("remove the applied policy; a restart may run it instead of the config file", "file", path, "err", err)
	}
}

// pinsFile records which maps were pinned under which pin directory after
// the last successful start, so that a pin deleted by hand is noticed
// instead of silently recreated empty.
const pinsFile = "pins.json"

type pinRecord struct {
	PinDir string   `json:"pin_dir"`
	Maps   []string `json:"maps"`
}

// recreatable are maps a start may create afresh when their pin was
// deleted: they hold counters and samples, not enforcement state; the loss
// is a counter reset (which rate() handles) and a moment without samples.
// Every other map holds buckets, the new-source filter, lists, the policy
// generations or the IPv4 direct table: created empty beside a running
// program, buckets would start full (a burst passes) and the running
// program and the new one would disagree, so the start is refused.
var recreatable = map[string]bool{
	loader.LimiterMapStats: true, loader.LimiterMapRuleStats: true, loader.LimiterMapSamples: true,
}

func pinnedMapNames(pinDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(pinDir, "maps"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// checkPins compares the map pins with those recorded at the last start.
// Caller is start, before the data plane loads.
func (d *Daemon) checkPins() error {
	if d.opts.PinDir == "" {
		return nil
	}
	have, err := pinnedMapNames(d.opts.PinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil // first start on this pin dir (or after detach --unpin, or a reboot)
	}
	if err != nil {
		return fmt.Errorf("read pinned maps: %w", err)
	}
	var rec pinRecord
	ok, err := d.readStateFile(pinsFile, func(b []byte) error { return json.Unmarshal(b, &rec) })
	if err != nil || !ok || rec.PinDir != d.opts.PinDir {
		return err
	}
	present := map[string]bool{}
	for _, n := range have {
		present[n] = true
	}
	var refuse, recreate []string
	for _, n := range rec.Maps {
		switch {
		case present[n]:
		case recreatable[n]:
			recreate = append(recreate, n)
		default:
			refuse = append(refuse, n)
		}
	}
	if len(recreate) > 0 {
		d.log.Warn("pinned maps were deleted by hand; they are recreated empty (their counters restart from zero)",
			"pin_dir", d.opts.PinDir, "maps", recreate)
	}
	if len(refuse) > 0 {
		return fmt.Errorf("pinned maps deleted by hand under %s/maps: %s: they hold limiter state (buckets, lists, "+
			"the policy generations), and recreated empty they would let bursts through while the running program "+
			"keeps the old ones. Refusing to start; to start over on purpose run 'edgectl detach --unpin --pin-dir %s' "+
			"(all data-plane state is lost) and start again", d.opts.PinDir, strings.Join(refuse, ", "), d.opts.PinDir)
	}
	return nil
}

// recordPins saves the map pins after a successful start.
func (d *Daemon) recordPins() {
	path := d.statePath(pinsFile)
	if path == "" || d.opts.PinDir == "" {
		return
	}
	names, err := pinnedMapNames(d.opts.PinDir)
	if err != nil {
		d.log.Warn("record pinned maps", "err", err)
		return
	}
	data, _ := json.MarshalIndent(pinRecord{PinDir: d.opts.PinDir, Maps: names}, "", "  ")
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		d.log.Warn("record pinned maps: a map pin deleted by hand will not be noticed", "err", err)
	}
}
