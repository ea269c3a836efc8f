package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
)

func newStatusCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show interfaces, XDP mode, program and map ids, policy generation and table fill",
		Args:  cobra.NoArgs,
	}
	asJSON := addJSONFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		st, err := newClient(cmd).Status(cmd.Context())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), st)
		}
		return writeStatus(cmd.OutOrStdout(), st)
	}
	return cmd
}

func writeStatus(out io.Writer, st control.Status) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "policy\t%s (generation %d, data plane half %d, mode %s, clock %s)\n",
		st.Policy, st.Generation, st.DataGen, st.Mode, st.Clock)
	r := st.LastReload
	result := "ok"
	if !r.OK {
		result = "FAILED: " + r.Error
	}
	fmt.Fprintf(w, "last reload\t%s by %s: %s\n", r.Time.Format(time.RFC3339), r.Trigger, result)
	fmt.Fprintf(w, "program\tid %d, pins under %s\n", st.ProgramID, st.PinDir)
	for _, i := range st.Interfaces {
		fmt.Fprintf(w, "interface\t%s (ifindex %d), xdp %s\n", i.Name, i.Ifindex, i.XDPMode)
	}
	fmt.Fprintf(w, "asn data\t%d entries\n", st.ASNEntries)
	fmt.Fprintf(w, "ipv4 lookup\t%s\n", ipv4Lookup(st.IPv4Direct))
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
	asJSON := addJSONFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		st, err := newClient(cmd).Stats(cmd.Context())
		if err != nil {
			return err
		}
		if *asJSON {
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
	return writeL7Stats(out, st.L7)
}

func newTopCommand() *cobra.Command {
	var once bool
	var window, every time.Duration
	var n int
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show the top dropped sources, prefixes and ASNs from drop samples, refreshing live",
		Long: `Show the top dropped sources, /24 (IPv4) or /48 (IPv6) prefixes and ASNs, from the data
plane's drop samples over the last --window. Counts are samples: the data plane sends at
most 1,000 per second, so shares are exact only while drops stay under that rate.
It refreshes every --every until interrupted; --once prints once (for scripts).`,
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

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func writeTop(out io.Writer, t control.Top) {
	fmt.Fprintf(out, "drop samples in the last %s: %d\n", time.Duration(t.Window), t.Samples)
	for _, sec := range []struct {
		title string
		rows  []control.TopEntry
	}{{"SOURCE", t.Sources}, {"PREFIX", t.Prefixes}, {"ASN", t.ASNs}} {
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "\n%s\tSAMPLES\tSHARE\n", sec.title)
		for _, r := range sec.rows {
			fmt.Fprintf(w, "%s\t%d\t%.1f%%\n", r.Key, r.Samples, 100*r.Share)
		}
		w.Flush()
	}
}

func newASNCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "asn", Short: "Look up IP-to-ASN data"}
	var data string
	lookup := &cobra.Command{
		Use:   "lookup IP",
		Short: "Show the ASN, country and rule of an address",
		Long: `Show the ASN, country and rule the running daemon gives an address. With --data FILE
it looks the address up in an iptoasn TSV (plain or gzip) or MaxMind .mmdb file instead,
without a daemon.`,
		Args: cobra.ExactArgs(1),
	}
	asJSON := addJSONFlag(lookup)
	lookup.Flags().StringVar(&data, "data", "", "look up in this ASN data file instead of asking the daemon")
	lookup.RunE = func(cmd *cobra.Command, args []string) error {
		ip, err := netip.ParseAddr(args[0])
		if err != nil {
			return usageError{fmt.Errorf("bad address %q: %w", args[0], err)}
		}
		var info control.ASNInfo
		if data != "" {
			t, err := asn.Load(cmd.Context(), []string{data}, asn.Options{Progress: progressBar(cmd.ErrOrStderr(), "loading "+data)})
			if err != nil {
				return err
			}
			e, ok := t.Lookup(ip.Unmap())
			info = control.ASNInfo{IP: ip, Found: ok}
			if ok {
				info.Prefix, info.ASN, info.Country = e.Prefix, e.ASN, asn.CountryString(e.Country)
			}
		} else if info, err = newClient(cmd).LookupASN(cmd.Context(), ip.String()); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), info)
		}
		if !info.Found {
			fmt.Fprintf(cmd.OutOrStdout(), "%s: no ASN data", info.IP)
		} else {
			fmt.Fprintf(cmd.OutOrStdout(), "%s: AS%d %s (%s)", info.IP, info.ASN, strings.TrimSpace(info.Country), info.Prefix)
		}
		if info.Rule != "" {
			fmt.Fprintf(cmd.OutOrStdout(), ", rule %s", info.Rule)
		}
		fmt.Fprintln(cmd.OutOrStdout())
		return nil
	}
	cmd.AddCommand(lookup)
	return cmd
}
