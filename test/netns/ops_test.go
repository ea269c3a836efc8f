package netns_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeguard/edgeguard/test/netns"
)

// The operations tests (issue 25): what an operator's first week finds.
// Each runs the real daemon in a private namespace.

// stateDir is the harness daemon's --state-dir (testbed.Daemon's default).
func (h *daemonHarness) stateDir() string {
	if h.StateDir != "" {
		return h.StateDir
	}
	return filepath.Join(filepath.Dir(h.Socket), "state")
}

// TestFailedStartTouchesNothing: a start that cannot succeed (a YAML
// error, an interface that does not exist) leaves the state directory as
// it was: the applied hotfix stays and runs at the next good start, and a
// corrupt lists file is not moved aside. A start under another --config
// says so, not that the file changed.
func TestFailedStartTouchesNothing(t *testing.T) {
	s := netns.New(t).Star(2)
	h := newDaemonHarness(t, s.Edge)
	h.writePolicy(100000, 100000)
	good, _ := os.ReadFile(h.Config)
	h.start()
	hotfix := filepath.Join(t.TempDir(), "hotfix.yaml")
	os.WriteFile(hotfix, []byte(fmt.Sprintf(daemonPolicy, 90000, 90000)), 0o644)
	if _, err := h.ctl("policy", "apply", hotfix, "--yes"); err != nil {
		t.Fatal(err)
	}
	h.stop(syscall.SIGTERM)
	applied := filepath.Join(h.stateDir(), "applied-policy.json")
	lists := filepath.Join(h.stateDir(), "lists.json")
	savedApplied, err := os.ReadFile(applied)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := []byte(`[{"list": "deny", "prefix": "198.18.`)
	os.WriteFile(lists, corrupt, 0o600)

	for _, tc := range []struct{ name, yaml, want string }{
		{"yaml error", "apiVersion: edgeguard/v1\ninterfaces: [\n", "yaml"},
		{"missing interface", strings.Replace(string(good), "eg-c1", "eg-gone9", 1), "eg-gone9"},
	} {
		os.WriteFile(h.Config, []byte(tc.yaml), 0o644)
		err := h.Start(context.Background())
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), tc.want) {
			t.Fatalf("%s: start: %v; want a failure naming %q", tc.name, err, tc.want)
		}
		if got, err := os.ReadFile(applied); err != nil || !bytes.Equal(got, savedApplied) {
			t.Errorf("%s: the failed start changed %s: %v", tc.name, applied, err)
		}
		if got, err := os.ReadFile(lists); err != nil || !bytes.Equal(got, corrupt) {
			t.Errorf("%s: the failed start moved or changed %s: %v", tc.name, lists, err)
		}
	}
	// The operator puts the file back: the applied hotfix runs.
	os.WriteFile(h.Config, good, 0o644)
	h.start()
	if st := h.status(); st.Policy != hotfix {
		t.Errorf("after the failed starts the daemon runs %s (%s), want the applied %s", st.Policy, st.PolicyOrigin, hotfix)
	}
	if _, err := os.Stat(lists + ".corrupt"); err != nil {
		t.Errorf("the good start did not set the corrupt lists file aside: %v", err)
	}
	h.stop(syscall.SIGTERM)

	// Another --config: the log names that, not a change of the file.
	other := filepath.Join(t.TempDir(), "other.yaml")
	os.WriteFile(other, good, 0o644)
	h.Config = other
	mark := len(h.Logs())
	h.start()
	if logs := h.Logs()[mark:]; strings.Contains(logs, "the config file changed since") ||
		!strings.Contains(logs, "this start names") {
		t.Errorf("start under another --config: log does not say so:\n%s", logs)
	}
	h.stop(syscall.SIGTERM)
}
