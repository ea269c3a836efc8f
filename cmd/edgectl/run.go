package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/daemon"
	"github.com/edgeguard/edgeguard/internal/loader"
)

func newRunCommand() *cobra.Command {
	var (
		ifaces   []string
		mode     string
		pinDir   string
		keep     bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run --iface IFACE [--iface IFACE ...]",
		Short: "Attach the XDP limiter with the built-in default limits and report counters",
		Long: `Attach the XDP limiter to the given interfaces with the built-in default policy
(see README: per source 2,000 pkt/s, per /24 or /48 20,000 pkt/s, per ASN 200,000 pkt/s,
UDP reflection ports 100 pkt/s per source), print a counters line every few seconds,
and detach on SIGINT/SIGTERM. With --keep the program stays attached and keeps
enforcing from its pins under --pin-dir; the next run takes it over without a gap.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(ifaces) == 0 {
				return usageError{fmt.Errorf("no interface given: use --iface IFACE (repeatable)")}
			}
			m, err := loader.ParseMode(mode)
			if err != nil {
				return usageError{err}
			}
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			return daemon.Run(cmd.Context(), daemon.Config{
				Ifaces: ifaces, Mode: m, PinDir: pinDir, Keep: keep,
				Interval: interval, Out: cmd.OutOrStdout(), Logger: log,
			})
		},
	}
	cmd.Flags().StringArrayVar(&ifaces, "iface", nil, "interface to protect (repeatable)")
	cmd.Flags().StringVar(&mode, "xdp-mode", "auto", "xdp attach mode: auto (native, else generic), native or generic")
	cmd.Flags().StringVar(&pinDir, "pin-dir", loader.DefaultPinDir, "bpffs directory for pinned maps and links")
	cmd.Flags().BoolVar(&keep, "keep", false, "on stop, keep the program attached and enforcing (pinned)")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Second, "time between counter lines (0: none)")
	return cmd
}

func newDetachCommand() *cobra.Command {
	var pinDir string
	var unpin bool
	cmd := &cobra.Command{
		Use:   "detach",
		Short: "Detach a program left enforcing by 'run --keep' and, with --unpin, drop all its state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !unpin {
				return usageError{fmt.Errorf("detach removes the pinned program and its state: confirm with --unpin")}
			}
			if err := loader.Unpin(pinDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed pins under %s; the program detaches once no process holds it\n", pinDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&pinDir, "pin-dir", loader.DefaultPinDir, "bpffs directory for pinned maps and links")
	cmd.Flags().BoolVar(&unpin, "unpin", false, "remove pinned links and maps (all limiter state is lost)")
	return cmd
}
