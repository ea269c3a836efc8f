package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// demoNamePrefix names the demo's namespaces and pins (with the pid).
const demoNamePrefix = "eg-demo"

// demoPolicy is the built-in example policy's shape (examples/edgeguard.yaml),
// scaled to what one machine generates: per-source, per-/24 and per-ASN
// limits in the default rule and no rule naming the attacker. %s: interfaces and
// the ASN data path.
const demoPolicy = `apiVersion: edgeguard/v1
%smode: enforce
defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    packets: {rate: 200/s, burst: 400}
  per_prefix:
    group: {ipv4: 24, ipv6: 48}
    packets: {rate: 1k/s, burst: 1k}
  per_asn:
    packets: {rate: %d/s, burst: %d}
global:
  packets: {rate: 1M/s, burst: 1M}
rules:
  - name: udp-reflection
    match: {protocol: udp, src_ports: [53, 123, 1900, 11211]}
    per_source: {packets: {rate: 200/s, burst: 400}}
    per_prefix: {group: whole, packets: {rate: 1k/s, burst: 1k}}
tables:
  per_source_entries: 65536
  aggregate_entries: 16384
  prefix_entries: 4096
  list_entries: 1024
metrics: {listen: ""}
asn_data: {path: %s}
`

type demoOptions struct {
	duration, warmup, every time.Duration
	sources, perSource      int
	asnRate                 int
	legitRate               int
}

func newDemoCommand() *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show Edgeguard stopping a distributed flood in a private namespace testbed (needs root)",
		Long: `Build a private testbed of network namespaces (an edge, four legitimate clients, one
attacker; addresses from 198.18.0.0/15 and fd00::/8 only, nothing leaves the machine), run
the real daemon (this binary, 'edgectl run') on the edge with a built-in policy shaped like
the example policy, and run the distributed flood: 1,000 attacker addresses in one /16 and
one ASN, each sending at a rate a real client might, while the legitimate clients keep
making requests. A table shows, every --every, offered vs passed per class, the legitimate
clients' success and latency, and the top dropped prefixes from 'edgectl top'.

It stops by itself after --duration, or at Ctrl-C, and always removes its namespaces, pins
and processes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return errors.New("demo needs root (network namespaces, XDP): run it with sudo")
			}
			if o.duration <= 0 || o.duration > 10*time.Minute {
				return usageError{fmt.Errorf("--duration %v: want more than 0 and at most 10m", o.duration)}
			}
			if o.every < 100*time.Millisecond || o.warmup < 0 || o.legitRate < 1 || o.legitRate > 1000 || o.asnRate < 1 {
				return usageError{fmt.Errorf("--every %v, --warmup %v, --legit-rate %d, --asn-rate %d: want --every ≥ 100ms, --warmup ≥ 0, --legit-rate 1 to 1000, --asn-rate ≥ 1",
					o.every, o.warmup, o.legitRate, o.asnRate)}
			}
			if o.sources < 1 || o.sources > 65536 || o.perSource < 1 || o.sources*o.perSource > 200_000 {
				return usageError{fmt.Errorf("--sources %d × --per-source %d/s: want 1 to 65536 sources and at most 200k packets/s in all",
					o.sources, o.perSource)}
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().DurationVar(&o.duration, "duration", 20*time.Second, "how long the demo runs (at most 10m)")
	cmd.Flags().DurationVar(&o.warmup, "warmup", 3*time.Second, "legitimate traffic alone before the flood starts")
	cmd.Flags().DurationVar(&o.every, "every", 2*time.Second, "table refresh interval")
	cmd.Flags().IntVar(&o.sources, "sources", 1000, "attacker addresses, spread over 198.19.0.0/16")
	cmd.Flags().IntVar(&o.perSource, "per-source", 100, "packets per second from each attacker address")
	cmd.Flags().IntVar(&o.asnRate, "asn-rate", 10000, "the policy's per-ASN packet rate (and burst)")
	cmd.Flags().IntVar(&o.legitRate, "legit-rate", 13, "requests per second from each of the 8 legitimate addresses")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, o demoOptions) (err error) {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	if removed, err := testbed.RemoveStale(demoNamePrefix); err != nil {
		fmt.Fprintf(out, "warning: removing namespaces of earlier demos: %v\n", err)
	} else if len(removed) > 0 {
		fmt.Fprintf(out, "removed what an earlier, killed demo left behind: %v\n", removed)
	}
	dir, err := os.MkdirTemp("", "edgeguard-demo-")
	if err != nil {
		return fmt.Errorf("create the demo's directory: %w", err)
	}
	pid := os.Getpid()
	pins := fmt.Sprintf("/sys/fs/bpf/%s-%d", demoNamePrefix, pid)
	fmt.Fprintf(out, "building the testbed: namespaces %s-%d-*, pins %s\n", demoNamePrefix, pid, pins)
	lab, err := testbed.NewLab(testbed.LabConfig{
		Prefix: fmt.Sprintf("%s-%d", demoNamePrefix, pid), Legit: 4, Attackers: 1,
		Spoofed: []netip.Prefix{testbed.AttackerNet}, Bin: bin, Dir: dir, PinDir: pins,
	})
	// Everything below runs whatever happens: a failed step, the end of
	// the run, or Ctrl-C (main's context is cancelled on SIGINT/SIGTERM,
	// and further signals stay caught, so the cleanup is not cut short).
	defer func() {
		var cerr error
		if lab != nil {
			cerr = lab.Close()
		}
		cerr = errors.Join(cerr, os.RemoveAll(dir), os.RemoveAll(pins))
		if cerr != nil {
			fmt.Fprintf(out, "cleanup: %v\n", cerr)
			err = errors.Join(err, cerr)
			return
		}
		fmt.Fprintf(out, "cleaned up: namespaces, pins under %s, daemon and temporary files removed\n", pins)
	}()
	if err != nil {
		return err
	}
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	if err := os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644); err != nil {
		return fmt.Errorf("write asn data: %w", err)
	}
	if err := lab.WritePolicy(fmt.Sprintf(demoPolicy, lab.InterfacesYAML("auto"), o.asnRate, o.asnRate, asnPath)); err != nil {
		return err
	}
	fmt.Fprintf(out, "starting the daemon: %s run --config %s (in namespace %s)\n", bin, lab.PolicyPath(), lab.Star.Edge.Name)
	if err := lab.Daemon.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "policy: per source 200/s, per /24 1k/s, per ASN %d/s; attacker: %d addresses in %s (AS64500) × %d/s = %d/s after %v\n\n",
		o.asnRate, o.sources, testbed.AttackerNet, o.perSource, o.sources*o.perSource, o.warmup)
	return demoTraffic(ctx, out, lab, o)
}

// settled returns the program's counters since base and the packets the
// sink received since sinkBase, once the counters account for want packets
// and neither grew for 1.2 s: the daemon reads the data plane's counters
// once a second, so a reading right after the traffic lags by up to that.
// After 6 s it returns what it has.
func settled(ctx context.Context, lab *testbed.Lab, base testbed.Counters, sinkBase, want uint64) (testbed.Counters, uint64) {
	deadline := time.Now().Add(6 * time.Second)
	var last testbed.Counters
	var lastSink uint64
	var lastChange time.Time
	for {
		c := last
		if st, err := lab.Daemon.Stats(ctx); err == nil {
			c = testbed.CountersOf(st).Sub(base)
		}
		sink := lab.Sink.Other() - sinkBase
		now := time.Now()
		if last == nil || c.Total() != last.Total() || sink != lastSink {
			last, lastSink, lastChange = c, sink, now
		}
		if (c.Total() >= want && now.Sub(lastChange) > 1200*time.Millisecond) || now.After(deadline) {
			return last, lastSink
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func demoTraffic(ctx context.Context, out io.Writer, lab *testbed.Lab, o demoOptions) error {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var (
		wg       sync.WaitGroup
		legit    trafficgen.LegitProgress
		offered  atomic.Uint64
		lres     trafficgen.LegitResult
		fres     trafficgen.FloodResult
		lerr     error
		ferr     error
		start    = time.Now()
		sinkBase = lab.Sink.Other()
	)
	// The closing summary counts from here (the program's counters run
	// since the daemon started).
	st0, err := lab.Daemon.Stats(ctx)
	if err != nil {
		return fmt.Errorf("read the program's counters: %w", err)
	}
	base := testbed.CountersOf(st0)
	wg.Go(func() { lres, lerr = lab.LegitUDPProgress(ctx, o.legitRate, o.duration, false, &legit) })
	floodFor := o.duration - o.warmup
	if floodFor > 0 {
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(o.warmup):
			}
			fres, ferr = lab.Flood(ctx, lab.Attackers[0], trafficgen.Flood{
				Sources: []netip.Prefix{testbed.AttackerNet}, Distinct: o.sources, Proto: trafficgen.UDP,
				Payload: 32, Rate: o.sources * o.perSource, Count: o.sources * o.perSource * int(floodFor.Seconds()+1),
				Duration: floodFor, Seed: uint64(time.Now().UnixNano()), Progress: &offered,
			})
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	type reading struct {
		at                                  time.Time
		legitSent, legitOK, offered, passed uint64
	}
	read := func() reading {
		return reading{time.Now(), legit.Sent.Load(), legit.Replied.Load(), offered.Load(), lab.Sink.Other() - sinkBase}
	}
	prev := read()
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
		}
		cur := read()
		dt := cur.at.Sub(prev.at).Seconds()
		if dt < o.every.Seconds()/2 {
			continue // the run ended just after a refresh
		}
		rate := func(a, b uint64) float64 { return float64(b-a) / dt }
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(w, "t=%.0fs\tCLASS\tOFFERED/S\tPASSED/S\tDROPPED/S\tSUCCESS SO FAR\t\n", cur.at.Sub(start).Seconds())
		// Replies trail requests by a round trip, so the legit clients'
		// success is shown since the start, not per refresh.
		lsucc := "-"
		if cur.legitSent > 0 {
			lsucc = fmt.Sprintf("%.2f%%", 100*float64(cur.legitOK)/float64(cur.legitSent))
		}
		fmt.Fprintf(w, "\tlegit (%d addresses)\t%.0f\t%.0f\t\t%s\t\n", 2*len(lab.Legit),
			rate(prev.legitSent, cur.legitSent), rate(prev.legitOK, cur.legitOK), lsucc)
		offeredRate, passedRate := rate(prev.offered, cur.offered), rate(prev.passed, cur.passed)
		fmt.Fprintf(w, "\tattacker (%d addresses)\t%.0f\t%.0f\t%.0f\t\t\n", o.sources, offeredRate, passedRate, max(0, offeredRate-passedRate))
		w.Flush()
		if top, err := lab.Daemon.Top(ctx, 5*time.Second, 3); err == nil && top.Samples > 0 {
			show := func(what string, es []control.TopEntry) {
				var parts []string
				for _, e := range es {
					parts = append(parts, fmt.Sprintf("%s %.0f%%", e.Key, 100*e.Share))
				}
				fmt.Fprintf(out, "      top dropped %s (last 5s): %s\n", what, strings.Join(parts, ", "))
			}
			show("ASNs", top.ASNs)
			show("prefixes", top.Prefixes)
		}
		fmt.Fprintln(out)
		prev = cur
	}
	if lerr != nil || ferr != nil {
		return errors.Join(lerr, ferr)
	}
	// One reading for the closing lines: the program's counters and the
	// sink once both account for the traffic and stopped growing.
	c, passed := settled(context.WithoutCancel(ctx), lab, base, sinkBase, fres.Sent+uint64(lres.Sent))
	fmt.Fprintf(out, "legit clients: %v\n", lres)
	if fres.Sent > 0 {
		// What reached the program from the attacker: everything it
		// counted but the legit clients' requests (and non-IP frames).
		counted := c.Total() - c["pass/non_ip"]
		attacker := counted - min(counted, uint64(lres.Sent))
		budget := float64(o.asnRate) + float64(o.asnRate)*fres.Elapsed.Seconds()
		fmt.Fprintf(out, "attacker: offered %d in %v (the generator sent %d), passed %d (%.1f%%); the ASN budget for that time is %.0f (burst + rate × time)\n",
			attacker, fres.Elapsed.Round(time.Millisecond), fres.Sent, passed, 100*float64(passed)/float64(max(attacker, 1)), budget)
	}
	fmt.Fprintf(out, "program counters since the demo started: pass %d, drop %d (asn_limit %d, prefix_limit %d, source_limit %d) = %d, "+
		"of which %d legit requests\n", c.Action("pass"), c.Action("drop"), c["drop/asn_limit"], c["drop/prefix_limit"],
		c["drop/source_limit"], c.Action("pass")+c.Action("drop"), lres.Sent)
	return nil
}
