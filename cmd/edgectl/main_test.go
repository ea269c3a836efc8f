package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHelpOfEveryCommand runs --help on every command: it must succeed and
// describe the command.
func TestHelpOfEveryCommand(t *testing.T) {
	root := newRootCommand()
	for _, c := range append(root.Commands(), root) {
		args := []string{"--help"}
		if c != root {
			args = []string{c.Name(), "--help"}
		}
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
		{[]string{"run"}, 2}, // no --iface
		{[]string{"run", "--iface", "x", "--xdp-mode", "odd"}, 2}, // bad mode
		{[]string{"run", "--bogus"}, 2},
		{[]string{"nonsense"}, 2},
		{[]string{"detach"}, 2}, // needs --unpin
	} {
		if got := execute(context.Background(), tc.args); got != tc.want {
			t.Errorf("edgectl %v: exit %d, want %d", tc.args, got, tc.want)
		}
	}
}
