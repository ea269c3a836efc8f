// Package testenv holds what tests across Edgeguard share to reach real
// parts of the machine and to wait for them: the root check of privileged
// tests, a real redis-server on a loopback port, WaitFor, the kernel's
// counters in /proc/net, the names collectors export. It is imported by
// tests and bench/ only (never by cmd/edgectl) and imports no Edgeguard
// package, so the tests of any package, internal or external, can import
// it without a cycle.
package testenv

import (
	"os"
	"testing"
)

// InCI reports whether the tests run in CI (CI set and not "false"), where
// a skip would hide a regression.
func InCI() bool {
	ci := os.Getenv("CI")
	return ci != "" && ci != "false"
}

// RequireRoot skips tb when not root, with the reason; in CI, which always
// runs as root, it fails instead.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		tb.Fatal("this test needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN), and CI must run it")
	}
	tb.Skip("needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN) to load BPF programs or create namespaces")
}
