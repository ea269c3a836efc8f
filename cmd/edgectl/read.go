package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
)

func newStatusCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show interfaces, XDP mode, program and map ids, policy generation and table fill",
		Args:  cobra.NoArgs,
	}
	asJSON := addOutputFlags(cmd)
	pinDir := addPinDirFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		json, err := asJSON()
		if err != nil {
			return err
		}
		st, err := newClient(cmd).Status(cmd.Context())
		if err != nil {
			return withKeptProgram(err, *pinDir)
		}
		if json {
			return printJSON(cmd.OutOrStdout(), st)
		}
		return writeStatus(cmd.OutOrStdout(), st)
	}
	return cmd
}

func addPinDirFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("pin-dir", loader.DefaultPinDir,
		"where to look for a program left enforcing when no daemon runs (the daemon's --pin-dir)")
}

// withKeptProgram adds to "no daemon" what the pins say: a program left
// attached by 'edgectl run --keep' (or a crash) keeps enforcing with no
// daemon, and the operator must know that, not only that none runs.
func withKeptProgram(err error, pinDir string) error {
	if !errors.Is(err, control.ErrNotRunning) {
		return err
	}
	pls, perr := loader.PinnedLinks(pinDir)
	if perr != nil || len(pls) == 0 {
		return err
	}
	var on, severed []string
	for _, pl := range pls {
		if pl.Kind != "xdp" || !pl.Ours {
			continue
		}
		if pl.Ifindex == 0 {
			severed = append(severed, pl.Name)
			continue
		}
		on = append(on, fmt.Sprintf("%s (ifindex %d)", pl.Name, pl.Ifindex))
	}
	if len(on) == 0 {
		return err
	}
	msg := fmt.Sprintf("but the program is ATTACHED AND ENFORCING from the pins under %s on %s, with the last policy "+
		"the daemon applied (left by 'edgectl run --keep' or a crash): nothing reloads it, expires run-time list "+
		"entries from the daemon's view or reads its samples. 'edgectl run' takes it over; "+
		"'edgectl detach --unpin --pin-dir %s' removes it", pinDir, strings.Join(on, ", "), pinDir)
	if len(severed) > 0 {
		msg += fmt.Sprintf(" (severed links, their interfaces gone: %s)", strings.Join(severed, ", "))
	}
	return fmt.Errorf("%w\n%s", err, msg)
}

func writeStatus(out io.Writer, st control.Status) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	up := "?"
	if !st.Started.IsZero() {
		up = fmt.Sprintf("up %s (since %s)", (time.Duration(st.UptimeSeconds) * time.Second).String(), st.Started.UTC().Format(time.RFC3339))
	}
	metrics := cmp.Or(st.MetricsAddr, "off")
	fmt.Fprintf(w, "daemon\tversion %s, %s, metrics %s, state %s\n", st.Version, up, metrics, cmp.Or(st.StateDir, "in memory only"))
	fmt.Fprintf(w, "policy\t%s (generation %d, data plane half %d, mode %s, clock %s)\n",
		st.Policy, st.Generation, st.DataGen, st.Mode, st.Clock)
	if st.PolicyOrigin != "" {
		fmt.Fprintf(w, "policy from\t%s\n", st.PolicyOrigin)
	}
	r := st.LastReload
	result := "ok"
	if !r.OK {
		result = "FAILED: " + r.Error
	}
	fmt.Fprintf(w, "last reload\t%s by %s: %s\n", r.Time.Format(time.RFC3339), r.Trigger, result)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "last reload\tNOT FOLLOWED by %s\n", p)
	}
	if st.StateNotSaved != "" {
		fmt.Fprintf(w, "state\tNOT SAVED: %s\n", st.StateNotSaved)
	}
	fmt.Fprintf(w, "program\tid %d, pins under %s\n", st.ProgramID, st.PinDir)
	for _, i := range st.Interfaces {
		if i.Problem != "" {
			fmt.Fprintf(w, "interface\t%s: NOT PROTECTED: %s\n", i.Name, i.Problem)
			continue
		}
		fmt.Fprintf(w, "interface\t%s (ifindex %d), xdp %s\n", i.Name, i.Ifindex, i.XDPMode)
	}
	fmt.Fprintf(w, "asn data\t%d entries\n", st.ASNEntries)
	fmt.Fprintf(w, "ipv4 lookup\t%s\n", ipv4Lookup(st.IPv4Direct))
	for _, c := range st.Congestion {
		fmt.Fprintf(w, "congestion\t%s\n", congestionLine(c))
	}
	for _, c := range st.CongestedInstances {
		fmt.Fprintf(w, "congested\t%s\n", instanceLine(c))
	}
	writeL7Status(w, st.L7)
	for _, m := range st.Maps {
		fill := ""
		if m.Entries > 0 || m.Name == "src_buckets" || m.Name == "agg_buckets" || m.Name == "lists" {
			fill = fmt.Sprintf(", %d/%d (%.1f%%)", m.Entries, m.Capacity, 100*float64(m.Entries)/float64(max(m.Capacity, 1)))
		}
		fmt.Fprintf(w, "map\t%s id %d, capacity %d%s\n", m.Name, m.ID, m.Capacity, fill)
	}
	return w.Flush()
}

// ipv4Lookup says how the active generation looks IPv4 sources up.
func ipv4Lookup(v control.IPv4Direct) string {
	if v.InUse {
		return fmt.Sprintf("direct table, %d/%d chunks (%.1f%%), %d IPv4 prefix facts",
			v.Chunks, v.CapacityChunks, 100*float64(v.Chunks)/float64(max(v.CapacityChunks, 1)), v.IPv4Facts)
	}
	s := "prefix trie"
	if v.OverBudget {
		s += fmt.Sprintf(", direct table OVER BUDGET (%d IPv4 prefix facts)", v.IPv4Facts)
	}
	if v.Reason != "" {
		s += ": " + v.Reason
	}
	return s
}

func newStatsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show counter totals and rates, per reason and per rule",
		Args:  cobra.NoArgs,
	}
	asJSON := addOutputFlags(cmd)
	pinDir := addPinDirFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		json, err := asJSON()
		if err != nil {
			return err
		}
		st, err := newClient(cmd).Stats(cmd.Context())
		if err != nil {
			return withKeptProgram(err, *pinDir)
		}
		if json {
			return printJSON(cmd.OutOrStdout(), st)
		}
		return writeStats(cmd.OutOrStdout(), st)
	}
	return cmd
}

func writeStats(out io.Writer, st control.Stats) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "ACTION\tREASON\tPACKETS\tBYTES\tPKT/S\tBYTES/S\t\n")
	for _, c := range st.Totals {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t\n", c.Action, c.Reason, c.Packets, c.Bytes, human(c.PacketRate), human(c.ByteRate))
	}
	fmt.Fprintf(w, "\t\t\t\t\t\t\n")
	fmt.Fprintf(w, "RULE\tPASSED\tDROPPED\tWOULD-DROP\tPASS/S\tDROP/S\t\n")
	for _, r := range st.Rules {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t\n", r.Rule, r.Passed, r.Dropped, r.WouldDrop, human(r.PassedRate), human(r.DroppedRate+r.WouldDropRate))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "(rates over the last %s)\n", time.Duration(st.Window))
	if err := writeStanding(out, st.Standing); err != nil {
		return err
	}
	if err := writeSynStats(out, st.SYN); err != nil {
		return err
	}
	if err := writeSamplerStats(out, st.Sampler); err != nil {
		return err
	}
	return writeL7Stats(out, st.L7, st.L7Classes)
}

func newTopCommand() *cobra.Command {
	var once bool
	var window, every time.Duration
	var n int
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show the top dropped sources, prefixes, ASNs, reasons and rules from samples, refreshing live",
		Long: `Show the top sources, /24 (IPv4) or /48 (IPv6) prefixes, ASNs, reasons (source_limit,
deny_list, ...) and rules in the data plane's samples over the last --window. Each row is one
key and ACTION: drop (the packets were dropped) or would_drop (a rule in dry-run mode would
have dropped them; they passed). Counts are samples, not packets: the data plane sends at
most 1,000 per second (bursts of 100), so shares are exact only while drops stay under
that rate. It refreshes every --every until interrupted; --once prints once (for scripts).`,
		Args: cobra.NoArgs,
	}
	asJSON := addJSONFlag(cmd)
	cmd.Flags().BoolVar(&once, "once", false, "print once and exit")
	cmd.Flags().DurationVar(&window, "window", time.Minute, "how far back to count")
	cmd.Flags().DurationVar(&every, "every", 2*time.Second, "refresh interval")
	cmd.Flags().IntVarP(&n, "number", "n", 10, "entries per table")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c := newClient(cmd)
		live := !once && !*asJSON && isTerminal(cmd.OutOrStdout())
		for {
			top, err := c.Top(cmd.Context(), control.Duration(window), n)
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cmd.OutOrStdout(), top)
			}
			if live {
				fmt.Fprint(cmd.OutOrStdout(), "\x1b[H\x1b[2J")
			}
			writeTop(cmd.OutOrStdout(), top)
			if !live {
				return nil
			}
			select {
			case <-cmd.Context().Done():
				return nil
			case <-time.After(every):
			}
		}
	}
	return cmd
}

// isTerminal says whether a command's stdin or stdout is a terminal.
func isTerminal(rw any) bool {
	f, ok := rw.(*os.File)
	if !ok {
		return false
	}
	// A terminal answers the termios ioctl; /dev/null, also a character
	// device, does not.
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func writeTop(out io.Writer, t control.Top) {
	fmt.Fprintf(out, "samples in the last %s: %d (ACTION drop: dropped; would_drop: a dry-run rule's, not dropped)\n",
		time.Duration(t.Window), t.Samples)
	for _, sec := range []struct {
		title string
		rows  []control.TopEntry
	}{{"SOURCE", t.Sources}, {"PREFIX", t.Prefixes}, {"ASN", t.ASNs}, {"REASON", t.Reasons}, {"RULE", t.Rules}} {
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "\n%s\tACTION\tSAMPLES\tSHARE\n", sec.title)
		for _, r := range sec.rows {
			fmt.Fprintf(w, "%s\t%s\t%d\t%.1f%%\n", r.Key, r.Action, r.Samples, 100*r.Share)
		}
		w.Flush()
	}
}
