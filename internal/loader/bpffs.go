package loader

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ensureBPFFS makes sure dir is on a bpf filesystem, mounting one at dir
// when dir is an empty mount point (as /sys/fs/bpf is on a machine that has
// not mounted it yet), with the manual fix in the error otherwise.
func ensureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("stat %s: %w (is bpffs mounted? mount -t bpf bpf /sys/fs/bpf)", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) == 0 {
		if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s is not on a bpf filesystem: mount -t bpf bpf /sys/fs/bpf", dir)
}
