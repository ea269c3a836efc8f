package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	buildversion "github.com/edgeguard/edgeguard/internal/version"
)

// Set by the Makefile (and the package build) with
// -ldflags "-X main.version=... -X main.commit=... -X main.date=...".
var version, commit, date string

// buildInfo is this binary's version: the stamp, else the toolchain's.
func buildInfo() buildversion.Info {
	return buildversion.Read(buildversion.Stamp{Version: version, Commit: commit, Date: date})
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "edgectl",
		Short:         "Run and control Edgeguard, an XDP + HTTP edge flood limiter",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildInfo().String(),
	}
	root.SetVersionTemplate("edgectl {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	root.PersistentFlags().String("log-format", "text", "log format: text or json")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("socket", control.DefaultSocket, "the daemon's control socket")
	root.AddCommand(newRunCommand(), newDetachCommand(), newVersionCommand(), newStatusCommand(),
		newStatsCommand(), newTopCommand(), newPolicyCommand(), newListCommand(control.Deny),
		newListCommand(control.Allow), newASNCommand(), newDemoCommand(), newExplainCommand())
	root.AddCommand(newFleetCommand())
	root.AddCommand(newShieldCommand())
	root.AddCommand(newL7Command())
	root.AddCommand(newShowCommand())
	root.AddCommand(newBGPCommand())
	root.AddCommand(newCaptureCommand())
	root.AddCommand(newGenDocsCommand()) // man pages and completions for make deb
	// cobra's 'completion' group, made now so that a shell it does not know
	// ('completion tcsh') is a usage error, not its help with exit 0.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			groupCommand(c)
		}
	}
	return root
}

// groupCommand makes a command that only groups others refuse words it
// does not know: cobra would print the group's help and exit 0 for a
// mistyped subcommand ('edgectl deny ad 1.2.3.4').
func groupCommand(cmd *cobra.Command) {
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if c.SuggestionsMinimumDistance <= 0 {
			c.SuggestionsMinimumDistance = 2
		}
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf(": did you mean %q?", s[0])
		}
		return usageError{fmt.Errorf("%s (see '%s --help')", msg, c.CommandPath())}
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
}

func isCobraUsageError(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.Contains(s, "accepts ") || strings.HasPrefix(s, "required flag")
}

func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	format, _ := cmd.Flags().GetString("log-format")
	levelName, _ := cmd.Flags().GetString("log-level")
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, usageError{fmt.Errorf("bad --log-level %q: use debug, info, warn or error", levelName)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, usageError{fmt.Errorf("bad --log-format %q: use text or json", format)}
}

func newVersionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
	}
	asJSON := addOutputFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		info := buildInfo()
		if json, err := asJSON(); err != nil {
			return err
		} else if json {
			return printJSON(cmd.OutOrStdout(), info)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "edgectl %s\n", info)
		return nil
	}
	return cmd
}
