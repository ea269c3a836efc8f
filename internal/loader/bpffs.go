package loader

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// checkBPFFS reports whether dir is on a bpf filesystem, with the fix when
// it is not.
func checkBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("stat %s: %w (is bpffs mounted? mount -t bpf bpf /sys/fs/bpf)", dir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("%s is not on a bpf filesystem: mount -t bpf bpf /sys/fs/bpf", dir)
	}
	return nil
}
