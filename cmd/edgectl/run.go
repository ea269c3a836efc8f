package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/daemon"
	"github.com/edgeguard/edgeguard/internal/l7/redislimit"
	"github.com/edgeguard/edgeguard/internal/loader"
)

// defaultStateDir is systemd's StateDirectory=edgeguard.
const defaultStateDir = "/var/lib/edgeguard"

func newRunCommand() *cobra.Command {
	var (
		config   string
		ifaces   []string
		mode     string
		pinDir   string
		metrics  string
		keep     bool
		interval time.Duration
		v4Chunks uint32
		stateDir string
	)
	cmd := &cobra.Command{
		Use:   "run [--config FILE] [--iface IFACE ...]",
		Short: "Run the daemon: attach the XDP limiter, apply the policy, serve metrics and the control socket",
		Long: `Run the Edgeguard daemon in the foreground.

It loads the XDP program (or takes over the one pinned by an earlier run, without a gap in
enforcement), attaches it to the policy's interfaces (or those given with --iface), applies
the policy atomically and serves /metrics and the control socket used by the other edgectl
commands. It reloads the policy on SIGHUP and when the file changes; a policy that does not
validate is logged and the running one kept. SIGUSR1 reopens the L7 access log file
(l7.access_log), for logrotate. Without --config it runs the built-in default
policy (examples/edgeguard.yaml; see the README for its limits).

On SIGINT/SIGTERM it detaches. With --keep the program stays attached and keeps enforcing from
its pins under --pin-dir; the next 'edgectl run' takes it over.

One daemon per --pin-dir (it holds a lock on the directory, which must be on the host's bpffs:
inside a network namespace use 'nsenter --net=...', not 'ip netns exec'). Run-time list entries
and a policy applied with 'edgectl policy apply' are kept in --state-dir across restarts and
reboots; the --config file is never rewritten. A start that fails removes only what it made.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := loader.ParseMode(mode)
			if err != nil {
				return usageError{err}
			}
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			// The standard library's own lines (net/http's Transport:
			// "Unsolicited response received on idle HTTP channel ...")
			// go through the structured logger too, so --log-format json
			// holds for every line; a process-wide setting, here only.
			slog.SetDefault(log.With("source", "go"))
			socket, _ := cmd.Flags().GetString("socket")
			// A closed stdout (edgectl run | head -1) must not kill the
			// daemon: with SIGPIPE ignored the write fails with EPIPE,
			// which the daemon logs, and it keeps running.
			signal.Ignore(syscall.SIGPIPE)
			// The process-wide setting, here only: the L7 event loop runs
			// one loop per core, each on its own OS thread, and one P more
			// than loops keeps the runtime from retaking a sleeping loop's
			// P every 20µs (docs/l7-proxy.md, "Engines").
			cores := runtime.GOMAXPROCS(0)
			runtime.GOMAXPROCS(cores + 1)
			// go-redis logs through one process-wide logger: structured,
			// ours. Both the L7 stage's Redis and the fleet's use it, so its
			// lines name the client, not a stage.
			redis.SetLogger(redislimit.ClientLogger(log.With("component", "redis-client")))
			reload := make(chan struct{}, 1)
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			reopen := make(chan struct{}, 1)
			usr1 := make(chan os.Signal, 1)
			signal.Notify(usr1, syscall.SIGUSR1)
			defer signal.Stop(usr1)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-hup:
						select {
						case reload <- struct{}{}:
						default:
						}
					case <-usr1:
						select {
						case reopen <- struct{}{}:
						default:
						}
					}
				}
			}()
			err = daemon.Run(ctx, daemon.Options{
				ConfigPath: config, Ifaces: ifaces, Mode: m, PinDir: pinDir, Socket: socket, StateDir: stateDir,
				MetricsListen: metrics, Keep: keep, Interval: interval, Out: cmd.OutOrStdout(), IPv4DirectChunks: v4Chunks,
				Logger: log, Reload: reload, ReopenLogs: reopen, Build: buildInfo(),
				ASNProgress: progressBar(cmd.ErrOrStderr(), "loading asn data"), L7Loops: cores,
			})
			return asValidation(err)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "policy file (default: the built-in policy)")
	cmd.Flags().StringArrayVar(&ifaces, "iface", nil, "interface to protect, instead of the policy's (repeatable)")
	cmd.Flags().StringVar(&mode, "xdp-mode", "auto", "xdp attach mode for --iface: auto (native, else generic), native or generic")
	cmd.Flags().StringVar(&pinDir, "pin-dir", loader.DefaultPinDir, "bpffs directory for pinned maps and links")
	cmd.Flags().StringVar(&metrics, "metrics-listen", "", `metrics address, overriding the policy's ("off" disables)`)
	cmd.Flags().StringVar(&stateDir, "state-dir", defaultStateDir,
		"durable state: run-time list entries and the policy applied with 'edgectl policy apply' (\"\": in memory only)")
	cmd.Flags().BoolVar(&keep, "keep", false, "on stop, keep the program attached and enforcing (pinned)")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Second, "time between counter lines (0: none)")
	cmd.Flags().Uint32Var(&v4Chunks, "ipv4-direct-chunks", 0,
		"IPv4 direct table budget, 128-byte chunks per policy generation, allocated twice at start; "+
			"overrides the policy's tables.ipv4_direct_chunks (0: the policy's, default 262144)")
	return cmd
}

func newDetachCommand() *cobra.Command {
	var pinDir string
	var unpin bool
	cmd := &cobra.Command{
		Use:   "detach --unpin",
		Short: "Detach a program left enforcing by 'run --keep' and drop its data-plane state",
		Long: `Remove the pins under --pin-dir: the pinned links (the program leaves the interfaces once no
process holds it) and the pinned maps with all data-plane state (buckets, counters, the
list entries as the data plane holds them). It refuses while a daemon runs on that pin
directory: stop the daemon instead (without --keep it detaches by itself).

The daemon's state directory (--state-dir, default /var/lib/edgeguard) is not touched: the
run-time deny/allow entries and the policy applied with 'edgectl policy apply' are kept, and
the next 'edgectl run' restores them. To drop those too, remove STATE_DIR/lists.json and
STATE_DIR/applied-policy.json.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !unpin {
				return usageError{fmt.Errorf("detach removes the pinned program and its state: confirm with --unpin")}
			}
			removed, err := daemon.Detach(pinDir)
			if err != nil {
				return err
			}
			if !removed {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing pinned under %s: nothing to detach\n", pinDir)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed pins under %s; the program detaches once no process holds it "+
				"(run-time list entries and the applied policy in the state directory are kept)\n", pinDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&pinDir, "pin-dir", loader.DefaultPinDir, "bpffs directory for pinned maps and links")
	cmd.Flags().BoolVar(&unpin, "unpin", false, "remove pinned links and maps (all limiter state is lost)")
	return cmd
}
