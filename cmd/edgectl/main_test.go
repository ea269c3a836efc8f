package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpOfEveryCommand runs --help on every command of the tree: it must
// succeed and show usage.
func TestHelpOfEveryCommand(t *testing.T) {
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string{}, path...), sub.Name()))
		}
	}
	walk(newRootCommand(), nil)
	if len(paths) < 15 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, p := range paths {
		args := append(append([]string{}, p...), "--help")
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Errorf("%v: %v", args, err)
		}
		if !strings.Contains(out.String(), "Usage:") {
			t.Errorf("%v: no usage in output:\n%s", args, out.String())
		}
	}
}

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"version"}, 0},
		{[]string{"run", "--xdp-mode", "odd"}, 2},
		{[]string{"run", "--bogus"}, 2},
		{[]string{"nonsense"}, 2},
		{[]string{"detach"}, 2}, // needs --unpin
		{[]string{"deny", "add", "not-a-prefix"}, 2},
		{[]string{"policy", "validate", "testdata/invalid.yaml"}, 2},
		{[]string{"policy", "validate", "../../examples/edgeguard.yaml"}, 0},
		{[]string{"policy", "validate", "testdata/missing.yaml"}, 2},
		// No daemon listens on this socket: an operational error.
		{[]string{"status", "--socket", "/nonexistent/edgeguard.sock"}, 1},
	} {
		if got := execute(context.Background(), tc.args); got != tc.want {
			t.Errorf("edgectl %v: exit %d, want %d", tc.args, got, tc.want)
		}
	}
}

// TestExitCodesSayWhatHappened: a mistyped subcommand is an error, not the
// group's help; apply without a terminal and without --yes is refused; diff
// exits like diff(1).
func TestExitCodesSayWhatHappened(t *testing.T) {
	dir := t.TempDir()
	base, err := os.ReadFile("../../examples/edgeguard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	same := filepath.Join(dir, "same.yaml")
	os.WriteFile(same, base, 0o644)
	withL7 := filepath.Join(dir, "l7.yaml")
	os.WriteFile(withL7, append(append([]byte{}, base...), "\nl7:\n  listen: 127.0.0.1:18080\n  upstream: http://127.0.0.1:18081\n"...), 0o644)
	withIface := filepath.Join(dir, "iface.yaml")
	os.WriteFile(withIface, []byte(strings.Replace(string(base), "interfaces:\n", "interfaces:\n  - {name: eg-extra0}\n", 1)), 0o644)
	if !strings.Contains(string(base), "interfaces:\n") {
		t.Fatal("examples/edgeguard.yaml has no interfaces: list; the test needs one")
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	for _, tc := range []struct {
		args    []string
		want    int
		wantOut string
	}{
		{[]string{"deny", "ad", "1.2.3.4"}, 2, `did you mean "add"`},
		{[]string{"policy", "aply", "x.yaml"}, 2, `did you mean "apply"`},
		{[]string{"asn", "lokup", "1.2.3.4"}, 2, "unknown command"},
		{[]string{"policy"}, 0, "Usage:"},
		{[]string{"--version"}, 0, "edgectl "},
		{[]string{"version"}, 0, "go1"},
		{[]string{"policy", "apply", same, "--socket", "/nonexistent/eg.sock"}, 2, "--yes"},
		{[]string{"policy", "diff", same, "--from", same}, 0, "no change"},
		{[]string{"policy", "diff", withL7, "--from", same}, 1, "+ l7 section"},
		{[]string{"policy", "diff", same, "--from", withL7}, 1, "- l7 section"},
		{[]string{"policy", "diff", withIface, "--from", same}, 1, "+ interface eg-extra0"},
		{[]string{"policy", "diff", "testdata/invalid.yaml", "--from", same}, 2, "invalid"},
		{[]string{"policy", "diff", same, "--socket", "/nonexistent/eg.sock"}, 2, ""},
		{[]string{"policy", "fields", "standing"}, 0, "| `personal_budget.burst_seconds` | whole number, 1 to 60 | `2` |"},
		{[]string{"policy", "fields"}, 0, "fleet.redis.tls:"},
		{[]string{"policy", "fields", "l7.timeouts"}, 0, "| `tunnel_idle` | positive duration | `5m` |"},
		{[]string{"policy", "fields", "nope"}, 2, "sections: interfaces entry, global, lists"},
	} {
		cmd := newRootCommand()
		var out bytes.Buffer
		got := executeWith(context.Background(), cmd, tc.args, devnull, &out)
		if got != tc.want {
			t.Errorf("edgectl %v: exit %d, want %d\n%s", tc.args, got, tc.want, out.String())
		}
		if !strings.Contains(out.String(), tc.wantOut) {
			t.Errorf("edgectl %v: output lacks %q:\n%s", tc.args, tc.wantOut, out.String())
		}
	}
}

// TestValidateLoadsASNData: validate loads the policy's asn_data, resolved
// beside the policy file (not the working directory), or says it did not.
func TestValidateLoadsASNData(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "asn.tsv"), []byte("198.18.0.0\t198.18.0.255\t64500\tXX\tTEST\n"), 0o644)
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(`apiVersion: edgeguard/v1
interfaces: [{name: eth0}]
asn_data: {path: asn.tsv}
rules:
  - name: hoster
    match: {asns: [64500, 64501]}
    per_asn: {packets: {rate: 10k/s, burst: 20k}}
`), 0o644)
	run := func(args ...string) (int, string) {
		var out bytes.Buffer
		return executeWith(context.Background(), newRootCommand(), args, nil, &out), out.String()
	}
	code, out := run("policy", "validate", pol)
	if code != 0 || !strings.Contains(out, "asn.tsv loaded, 1 ranges") {
		t.Errorf("validate: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "64501") || strings.Contains(out, "AS64500 has no") {
		t.Errorf("validate with data should warn about AS64501 only:\n%s", out)
	}
	code, out = run("policy", "validate", "--no-asn", pol)
	if code != 0 || !strings.Contains(out, "NOT loaded") {
		t.Errorf("validate --no-asn: exit %d\n%s", code, out)
	}
	os.Remove(filepath.Join(dir, "asn.tsv"))
	if code, out = run("policy", "validate", pol); code != 1 || !strings.Contains(out, filepath.Join(dir, "asn.tsv")) {
		t.Errorf("validate with the asn data missing: exit %d, want 1 naming the resolved path\n%s", code, out)
	}
}
