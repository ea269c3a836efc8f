package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallDepsLeavesServicesOutsideCI (issue 25): scripts/install-deps.sh
// stops and disables redis-server, nginx, prometheus and bird only in CI or the
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
	script, err := os.ReadFile("../../scripts/install-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(neededCommands(t, string(script)), "apt-get", "systemctl") {
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
		if _, got := run(env); strings.Count(got, "systemctl disable --now") != 4 {
			t.Errorf("with %s the script did not stop and disable the four services:\n%s", env, got)
		}
	}
}

// neededCommands are the commands scripts/install-deps.sh looks for (its
// needs list's "command:package" entries; file entries left out), so the
// test stubs exactly what the script checks.
func neededCommands(t *testing.T, script string) []string {
	t.Helper()
	start := strings.Index(script, "needs=(")
	if start < 0 {
		t.Fatal("scripts/install-deps.sh has no needs=( list")
	}
	end := strings.Index(script[start:], "\n)")
	if end < 0 {
		t.Fatal("scripts/install-deps.sh: needs=( is not closed")
	}
	var out []string
	for _, line := range strings.Split(script[start+len("needs=("):start+end], "\n") {
		line = strings.Trim(strings.TrimSpace(line), `"`)
		what, _, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(what, "/") {
			continue
		}
		out = append(out, strings.ReplaceAll(what, "${CLANG_VERSION}", "19"))
	}
	if len(out) < 10 {
		t.Fatalf("read %d commands from install-deps.sh's needs list: %v", len(out), out)
	}
	return out
}
