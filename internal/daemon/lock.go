package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// checkPinDir refuses a pin directory that is not on a bpf filesystem, or
// whose parent is not: pins there would not be pins. The daemon never
// mounts a bpffs itself: one mounted over an ordinary directory stays
// mounted behind the operator's back, and under 'ip netns exec' (which
// gives the command a private /sys) it would be private to the process and
// vanish with it, taking a --keep'd program's pins along.
func checkPinDir(pinDir string) error {
	dir := pinDir
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		dir = filepath.Dir(pinDir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("pin dir %s: %w (is bpffs mounted? mount -t bpf bpf /sys/fs/bpf)", pinDir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	return fmt.Errorf("pin dir %s: %s is not on a bpf filesystem, so pins there would not outlive the daemon: "+
		"choose a --pin-dir under /sys/fs/bpf, or mount the host's bpffs (mount -t bpf bpf /sys/fs/bpf); "+
		"inside a network namespace run the daemon with 'nsenter --net=/run/netns/NAME', not 'ip netns exec' "+
		"(which mounts a private /sys without the host's bpffs)", pinDir, dir)
}

// checkPinDirOutlives refuses a pin directory on a bpffs that dies with
// the process: one mounted in a mount namespace of its own (what 'ip netns
// exec' gives a command, and 'mount -t bpf bpf /sys/fs/bpf' inside it
// makes), seen by no process outside it. A bpffs instance is known by its
// device number: the pins outlive the daemon when the same instance is
// mounted in the mount namespace of PID 1 (the host's, or the
// container's). With keep the start is refused; without it the daemon
// warns (its pins go when it exits, which is what a stop without --keep
// does anyway; a crash leaves nothing enforcing).
func (d *Daemon) checkPinDirOutlives(pinDir string) error {
	dir := pinDir
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		dir = filepath.Dir(pinDir)
	}
	private, err := privateMount(dir)
	if err != nil {
		d.log.Warn("cannot tell whether the pin dir's bpffs outlives the daemon", "pin_dir", pinDir, "err", err)
		return nil
	}
	if !private {
		return nil
	}
	why := fmt.Sprintf("pin dir %s: its bpf filesystem is mounted only in this process's mount namespace "+
		"(as after 'ip netns exec' and 'mount -t bpf bpf /sys/fs/bpf' inside it), not in PID 1's: it and every "+
		"pin on it vanish when the daemon exits", pinDir)
	if d.opts.Keep {
		return fmt.Errorf("%s, so --keep would keep nothing enforcing: run the daemon with "+
			"'nsenter --net=/run/netns/NAME edgectl run ...', which keeps the host's /sys/fs/bpf", why)
	}
	d.log.Warn(why+": a crash leaves nothing enforcing and a restart starts from empty tables", "pin_dir", pinDir)
	return nil
}

// privateMount says whether the bpffs instance holding dir is missing from
// PID 1's mounts (/proc/1/mountinfo): a mount namespace of this process's
// own, which ends with it.
func privateMount(dir string) (bool, error) {
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	pid1, err2 := os.Readlink("/proc/1/ns/mnt")
	if err1 == nil && err2 == nil && self == pid1 {
		return false, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	data, err := os.ReadFile("/proc/1/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read PID 1's mounts: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPEROPTS
		f := strings.Fields(line)
		_, after, ok := strings.Cut(line, " - ")
		if len(f) < 3 || !ok {
			continue
		}
		if f[2] == dev && strings.HasPrefix(after, "bpf ") {
			return false, nil
		}
	}
	return true, nil
}

// lockPinDir takes an exclusive flock on the pin directory itself (bpffs
// holds no regular files to lock), creating it if needed, so two daemons
// never drive the same pins, whatever their sockets and state directories.
// The lock dies with the process, however it exits. created says whether
// the directory was made here.
func (d *Daemon) lockPinDir() (created bool, err error) {
	dir := d.opts.PinDir
	if dir == "" {
		return false, nil
	}
	if err := checkPinDir(dir); err != nil {
		return false, err
	}
	if err := d.checkPinDirOutlives(dir); err != nil {
		return false, err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return false, fmt.Errorf("create pin dir: %w", err)
		}
		created = true
	}
	f, err := lockDir(dir)
	if err != nil {
		if created {
			os.Remove(dir)
		}
		return false, err
	}
	d.locks = append(d.locks, f)
	return created, nil
}

// lockStateDir locks the state directory the same way: two daemons with
// different pin directories must not share run-time lists either.
func (d *Daemon) lockStateDir() error {
	if d.opts.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(d.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	f, err := lockDir(d.opts.StateDir)
	if err != nil {
		return err
	}
	d.locks = append(d.locks, f)
	return nil
}

func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s to lock it: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another edgectl run holds %s: stop it first (edgectl status shows it): %w", dir, err)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// unlock releases the directory locks (at stop, and after a failed start).
func (d *Daemon) unlock() {
	for _, f := range d.locks {
		f.Close()
	}
	d.locks = nil
}

// Detach removes the pins under pinDir ('edgectl detach --unpin'), holding
// the pin directory's lock so it never pulls the pins from under a running
// daemon. The state directory is not touched. removed is false when
// nothing was pinned there.
func Detach(pinDir string) (removed bool, err error) {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	f, err := lockDir(pinDir)
	if err != nil {
		return false, fmt.Errorf("a daemon runs on %s: stop it instead (without --keep it detaches by itself): %w", pinDir, err)
	}
	defer f.Close()
	return true, loader.Unpin(pinDir)
}
