package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallDepsLeavesServicesOutsideCI (issue 25): scripts/install-deps.sh
// stops and disables redis-server, nginx and prometheus only in CI or the
// throwaway VM, never on an operator's host. It runs the real script with
// every command it looks for, apt-get and systemctl replaced by stubs that
// record their calls: nothing is installed, stopped or changed.
func TestInstallDepsLeavesServicesOutsideCI(t *testing.T) {
	for _, f := range []string{"/usr/include/bpf/bpf_helpers.h", "/usr/include/linux/bpf.h"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("%s is missing: the script would want to install it (scripts/install-deps.sh)", f)
		}
	}
	bin := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls")
	stub := "#!/bin/sh\necho \"$(basename \"$0\") $*\" >>" + calls + "\n"
	for _, c := range []string{"clang-19", "llvm-strip-19", "make", "ip", "nsenter", "redis-server", "redis-cli",
		"promtool", "nft", "iptables", "wrk", "nginx", "ethtool", "timeout", "sysctl", "apt-get", "systemctl"} {
		if err := os.WriteFile(filepath.Join(bin, c), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	run := func(env ...string) (string, string) {
		t.Helper()
		os.Remove(calls)
		cmd := exec.Command(bash, "../../scripts/install-deps.sh")
		// The stubs first, then bash's own directory (basename, for the
		// stubs): apt-get and systemctl are always the stubs.
		cmd.Env = append([]string{"PATH=" + bin + ":" + filepath.Dir(bash)}, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install-deps.sh %v: %v\n%s", env, err, out)
		}
		c, _ := os.ReadFile(calls)
		return string(out), string(c)
	}
	out, got := run()
	if strings.Contains(got, "systemctl") || strings.Contains(got, "apt-get") {
		t.Errorf("outside CI the script ran:\n%s", got)
	}
	if !strings.Contains(out, "left as they are") {
		t.Errorf("outside CI the script does not say it left the services alone:\n%s", out)
	}
	for _, env := range []string{"CI=true", "EDGEGUARD_THROWAWAY_VM=1"} {
		if _, got := run(env); strings.Count(got, "systemctl disable --now") != 3 {
			t.Errorf("with %s the script did not stop and disable the three services:\n%s", env, got)
		}
	}
}
