package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newGenDocsCommand writes the man pages and shell completions that the
// Debian package ships (make deb). Hidden: it is for packagers, and its
// output is in the package.
func newGenDocsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gendocs DIR",
		Short: "Write man pages (DIR/man1) and bash, zsh and fish completions (DIR/completions) for packaging",
		Long: `Write one man page per command into DIR/man1 (edgectl.1, edgectl-run.1, ...) and the
shell completions into DIR/completions (edgectl.bash, _edgectl for zsh, edgectl.fish).
The man pages' date is SOURCE_DATE_EPOCH when it is set (reproducible builds), else today.`,
		Args:   cobra.ExactArgs(1),
		Hidden: true,
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return genDocs(cmd.Root(), args[0])
	}
	return cmd
}

func genDocs(root *cobra.Command, dir string) error {
	manDir := filepath.Join(dir, "man1")
	compDir := filepath.Join(dir, "completions")
	for _, d := range []string{manDir, compDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("gendocs: %w", err)
		}
	}
	root.DisableAutoGenTag = true
	header := &doc.GenManHeader{
		Title:   "EDGECTL",
		Section: "1",
		Source:  "Edgeguard " + version,
		Manual:  "Edgeguard manual",
	}
	if err := doc.GenManTree(root, header, manDir); err != nil {
		return fmt.Errorf("gendocs: man pages: %w", err)
	}
	for _, c := range []struct {
		file string
		gen  func(path string) error
	}{
		{"edgectl.bash", func(p string) error { return root.GenBashCompletionFileV2(p, true) }},
		{"_edgectl", root.GenZshCompletionFile},
		{"edgectl.fish", func(p string) error { return root.GenFishCompletionFile(p, true) }},
	} {
		if err := c.gen(filepath.Join(compDir, c.file)); err != nil {
			return fmt.Errorf("gendocs: completion %s: %w", c.file, err)
		}
	}
	return nil
}
