package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// edgectlUseRE finds "edgectl" followed by the rest of its command line in
// docs, up to the end of a code span, a line, a pipe or a sentence break.
var edgectlUseRE = regexp.MustCompile("edgectl((?: +[-A-Za-z0-9_./:=<>\\[\\]{}\"',@*]+)*)")

// TestDocsNameRealCommandsAndFlags: every 'edgectl SUBCOMMAND ... --flag'
// the docs, the README and the shipped unit mention is a command that
// exists, with flags it has.
func TestDocsNameRealCommandsAndFlags(t *testing.T) {
	files := []string{"../../README.md", "../../deploy/systemd/edgeguard.service"}
	docs, _ := filepath.Glob("../../docs/*.md")
	files = append(files, docs...)
	root := newRootCommand()
	root.InitDefaultCompletionCmd() // cobra adds 'completion' when it runs
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
				continue
			}
			for _, loc := range edgectlUseRE.FindAllStringSubmatchIndex(line, -1) {
				// Code only: a fenced block, a `code span`, a command
				// line in the unit. "edgectl" in prose is a name.
				before := strings.TrimRight(line[:loc[0]], " ")
				code := inFence || strings.HasSuffix(before, "`") || strings.HasSuffix(before, "sudo") ||
					strings.HasSuffix(before, "/bin/")
				if !code {
					continue
				}
				words := strings.Fields(line[loc[2]:loc[3]])
				if len(words) == 0 {
					continue
				}
				cmd, rest := resolve(root, words)
				if cmd == root {
					// A path after edgectl is a build output or an argument
					// (go build -o bin/edgectl ./cmd/edgectl), not a command.
					if w := strings.TrimRight(words[0], "`.,;:)"); !strings.HasPrefix(w, "-") && !strings.ContainsAny(w[:1], "./") {
						t.Errorf("%s:%d: edgectl %s: no such command", f, i+1, w)
					}
					continue
				}
				checked++
				for _, w := range rest {
					if !strings.HasPrefix(w, "--") {
						continue
					}
					name := strings.TrimPrefix(w, "--")
					name, _, _ = strings.Cut(name, "=")
					name = strings.TrimRight(name, ".,;:)`'\"")
					if name == "" || name == "help" {
						continue
					}
					if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
						t.Errorf("%s:%d: %s has no flag --%s", f, i+1, cmd.CommandPath(), name)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d edgectl command lines found in the docs: the pattern is broken", checked)
	}
}

// resolve walks words down the command tree as far as they name
// subcommands.
func resolve(root *cobra.Command, words []string) (*cobra.Command, []string) {
	cmd := root
	for len(words) > 0 {
		var next *cobra.Command
		for _, c := range cmd.Commands() {
			if c.Name() == strings.TrimRight(words[0], ".,;:)`'\"") {
				next = c
			}
		}
		if next == nil {
			break
		}
		cmd, words = next, words[1:]
	}
	return cmd, words
}
