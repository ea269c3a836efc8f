package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// lockState takes an exclusive lock on StateDir/lock, so two daemons never
// drive the same pins and socket at once. The lock dies with the process,
// however it exits.
func (d *Daemon) lockState() error {
	if d.opts.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(d.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	path := filepath.Join(d.opts.StateDir, "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("another edgectl run holds %s: stop it first (edgectl status shows it): %w", path, err)
	}
	d.lock = f
	return nil
}
