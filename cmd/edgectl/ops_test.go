package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageErrorsExit2 (issue 25): usage errors exit 2 whatever the
// command, -o json is understood wherever --json is, and --ttl 0 is
// refused as --ttl -5s is. No daemon is needed: each fails before asking
// one, or asks a socket nobody serves (exit 1, not a flag error).
func TestUsageErrorsExit2(t *testing.T) {
	none := []string{"--socket", "/nonexistent/edgeguard.sock"}
	for _, tc := range []struct {
		args []string
		want int
		out  string
	}{
		{[]string{"completion", "tcsh"}, 2, `unknown command "tcsh"`},
		{[]string{"shield", "forbid", "banana"}, 2, "banana"},
		{[]string{"policy", "validate", "testdata/missing.yaml"}, 2, "no such file"},
		{[]string{"deny", "add", "198.18.0.1", "--ttl", "0"}, 2, "must be positive"},
		{[]string{"deny", "add", "198.18.0.1", "--ttl", "-5s"}, 2, "must be positive"},
		{append([]string{"status", "-o", "json"}, none...), 1, "no daemon"},
		{append([]string{"stats", "-o", "json"}, none...), 1, "no daemon"},
		{append([]string{"deny", "list", "-o", "json"}, none...), 1, "no daemon"},
		{append([]string{"status", "-o", "yaml"}, none...), 2, "use table or json"},
		{[]string{"version", "-o", "json"}, 0, `"version"`},
	} {
		var out bytes.Buffer
		if got := executeWith(context.Background(), newRootCommand(), tc.args, nil, &out); got != tc.want ||
			!strings.Contains(out.String(), tc.out) {
			t.Errorf("edgectl %v: exit %d, want %d, and output containing %q:\n%s", tc.args, got, tc.want, tc.out, out.String())
		}
	}
}

// TestBurstAndRateProblemsTogether: a limit whose rate and burst are both
// wrong gets both problems in one validation.
func TestBurstAndRateProblemsTogether(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(path, []byte(`apiVersion: edgeguard/v1
interfaces: [{name: eth0}]
defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    bytes: {rate: 20MBps, burst: 0}
`), 0o644)
	var out bytes.Buffer
	got := executeWith(context.Background(), newRootCommand(), []string{"policy", "validate", path}, nil, &out)
	if got != 2 || !strings.Contains(out.String(), `rate "20MBps"`) || !strings.Contains(out.String(), `burst "0"`) {
		t.Errorf("validate a limit with a bad rate and a bad burst: exit %d\n%s; want both problems, exit 2", got, out.String())
	}
}
