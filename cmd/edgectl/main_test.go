package main

import (
	"bytes"
	"context"
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
		{[]string{"policy", "validate", "testdata/missing.yaml"}, 1},
		// No daemon listens on this socket: an operational error.
		{[]string{"status", "--socket", "/nonexistent/edgeguard.sock"}, 1},
	} {
		if got := execute(context.Background(), tc.args); got != tc.want {
			t.Errorf("edgectl %v: exit %d, want %d", tc.args, got, tc.want)
		}
	}
}
