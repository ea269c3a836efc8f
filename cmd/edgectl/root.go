package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "edgectl",
		Short:         "Run and control Edgeguard, an XDP + HTTP edge flood limiter",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	root.PersistentFlags().String("log-format", "text", "log format: text or json")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("socket", control.DefaultSocket, "the daemon's control socket")
	root.AddCommand(newRunCommand(), newDetachCommand(), newVersionCommand(), newStatusCommand(),
		newStatsCommand(), newTopCommand(), newPolicyCommand(), newListCommand(control.Deny),
		newListCommand(control.Allow), newASNCommand(), newDemoCommand(), newExplainCommand())
	root.AddCommand(newGenDocsCommand()) // man pages and completions for make deb
	return root
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
	asJSON := addJSONFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), map[string]string{"version": version})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "edgectl %s\n", version)
		return nil
	}
	return cmd
}
