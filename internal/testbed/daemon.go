package testbed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

// Daemon runs the real edgectl binary as `edgectl run` inside a namespace
// (nsenter --net: only the network namespace changes, so the daemon sees
// the host's bpffs and its pins survive a restart) and drives it with the
// real CLI over its control socket.
type Daemon struct {
	Bin    string     // the edgectl binary
	NS     *Namespace // where the daemon runs
	Config string     // policy file
	PinDir string     // under /sys/fs/bpf
	Socket string     // control socket
	// StateDir is the daemon's --state-dir; empty: "state" beside Socket.
	StateDir string
	// Args are extra arguments for `edgectl run`.
	Args []string

	logs    lockedBuffer
	cmd     *exec.Cmd
	waitErr chan error
}

// timeScale stretches the daemon's start, stop and command deadlines by
// EDGEGUARD_TEST_TIME_SCALE (a whole factor, default 1): under an emulated
// CPU (scripts/kernel-matrix.sh runs the tests under QEMU's TCG) the
// daemon needs many times longer to load and attach. The tests'
// assertions on counters do not change.
func timeScale(d time.Duration) time.Duration {
	if n, err := strconv.Atoi(os.Getenv("EDGEGUARD_TEST_TIME_SCALE")); err == nil && n > 1 {
		return d * time.Duration(n)
	}
	return d
}

// Start runs the daemon and waits up to 20 s (times
// EDGEGUARD_TEST_TIME_SCALE) for its control socket to answer.
func (d *Daemon) Start(ctx context.Context) error {
	state := d.StateDir
	if state == "" {
		state = filepath.Join(filepath.Dir(d.Socket), "state")
	}
	args := append([]string{"--net=" + d.NS.Path(), d.Bin, "run", "--config", d.Config, "--pin-dir", d.PinDir,
		"--socket", d.Socket, "--state-dir", state, "--interval", "0"}, d.Args...)
	d.cmd = exec.Command("nsenter", args...)
	d.cmd.Stdout = &d.logs
	d.cmd.Stderr = &d.logs
	// No Pdeathsig: it fires when the forking OS thread exits, and the
	// threads that entered namespaces (Namespace.Do) exit by design.
	if err := d.cmd.Start(); err != nil {
		d.cmd = nil
		return fmt.Errorf("start daemon: %w", err)
	}
	d.waitErr = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(d.cmd, d.waitErr)
	wait := timeScale(20 * time.Second)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if _, err := d.Ctl(ctx, "status", "--json"); err == nil {
			return nil
		}
		select {
		case err := <-d.waitErr:
			d.cmd = nil
			return fmt.Errorf("daemon exited at start: %v\n%s", err, d.Logs())
		case <-ctx.Done():
			d.Kill()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	d.Kill()
	return fmt.Errorf("daemon socket did not come up within %v\n%s", wait, d.Logs())
}

// Running reports whether the daemon process is running.
func (d *Daemon) Running() bool { return d.cmd != nil }

// Stop sends sig and waits up to 15 s for the daemon to exit, then kills it.
func (d *Daemon) Stop(sig syscall.Signal) error {
	if d.cmd == nil {
		return nil
	}
	d.cmd.Process.Signal(sig)
	select {
	case <-d.waitErr:
		d.cmd = nil
		return nil
	case <-time.After(timeScale(15 * time.Second)):
		d.Kill()
		return fmt.Errorf("daemon did not stop within %v of %v", timeScale(15*time.Second), sig)
	}
}

// Signal sends sig to the daemon without waiting for it to exit.
func (d *Daemon) Signal(sig syscall.Signal) error {
	if d.cmd == nil {
		return errors.New("daemon not running")
	}
	return d.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (no cleanup runs in the daemon: pins stay) and waits.
func (d *Daemon) Kill() {
	if d.cmd != nil {
		d.cmd.Process.Kill()
		<-d.waitErr
		d.cmd = nil
	}
}

// Close stops the daemon (SIGTERM: it detaches and removes its pins) and
// removes the pin directory whatever happened.
func (d *Daemon) Close() error {
	err := d.Stop(syscall.SIGTERM)
	return errors.Join(err, os.RemoveAll(d.PinDir))
}

// Logs is what the daemon wrote so far.
func (d *Daemon) Logs() string { return d.logs.String() }

// Ctl runs the real CLI against the daemon's socket.
func (d *Daemon) Ctl(ctx context.Context, args ...string) ([]byte, error) {
	args = append(args, "--socket", d.Socket)
	ctx, cancel := context.WithTimeout(ctx, timeScale(30*time.Second))
	defer cancel()
	out, err := exec.CommandContext(ctx, d.Bin, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("edgectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Stats is `edgectl stats --json`.
func (d *Daemon) Stats(ctx context.Context) (control.Stats, error) {
	var st control.Stats
	out, err := d.Ctl(ctx, "stats", "--json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("stats --json: %w: %s", err, out)
	}
	return st, nil
}

// Status is `edgectl status --json`.
func (d *Daemon) Status(ctx context.Context) (control.Status, error) {
	var st control.Status
	out, err := d.Ctl(ctx, "status", "--json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("status --json: %w: %s", err, out)
	}
	return st, nil
}

// Top is `edgectl top --once --json --window W -n N`.
func (d *Daemon) Top(ctx context.Context, window time.Duration, n int) (control.Top, error) {
	var top control.Top
	out, err := d.Ctl(ctx, "top", "--once", "--json", "--window", window.String(), "-n", fmt.Sprint(n))
	if err != nil {
		return top, err
	}
	if err := json.Unmarshal(out, &top); err != nil {
		return top, fmt.Errorf("top --json: %w: %s", err, out)
	}
	return top, nil
}

// Counters are the data plane's packet counters, keyed "action/reason"
// (e.g. "drop/asn_limit"), from a Stats answer.
type Counters map[string]uint64

// CountersOf flattens st.Totals.
func CountersOf(st control.Stats) Counters {
	c := Counters{}
	for _, t := range st.Totals {
		c[t.Action+"/"+t.Reason] += t.Packets
	}
	return c
}

// Sub is c - base, per key.
func (c Counters) Sub(base Counters) Counters {
	out := Counters{}
	for k, v := range c {
		out[k] = v - base[k]
	}
	return out
}

// Action sums every reason of one action ("pass", "drop", "would_drop").
func (c Counters) Action(action string) uint64 {
	var n uint64
	for k, v := range c {
		if a, _, _ := strings.Cut(k, "/"); a == action {
			n += v
		}
	}
	return n
}

// Total sums everything the program saw.
func (c Counters) Total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
