package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
)

func newFleetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Fleet mode: hosts sharing lists and budgets through Redis (docs/fleet.md)",
	}
	groupCommand(cmd)
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the fleet's members, last sync, this host's shares of the busiest aggregates and the lists' lag",
		Args:  cobra.NoArgs,
	}
	asJSON := addJSONFlag(status)
	status.RunE = func(cmd *cobra.Command, _ []string) error {
		st, err := newClient(cmd).FleetStatus(cmd.Context())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), st)
		}
		return writeFleetStatus(cmd.OutOrStdout(), st, time.Now())
	}
	cmd.AddCommand(status)
	return cmd
}

func writeFleetStatus(out io.Writer, st control.FleetStatus, now time.Time) error {
	if !st.Enabled {
		msg := "fleet mode: off (the policy has no fleet: section)"
		if st.LastError != "" {
			msg = fmt.Sprintf("fleet mode: NOT RUNNING for fleet %q: %s", st.Name, st.LastError)
		}
		_, err := fmt.Fprintln(out, msg)
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	redis := "up"
	if !st.RedisUp {
		redis = "UNREACHABLE"
	}
	if st.Fallback {
		redis += ", static shares (budget ÷ fleet size)"
	}
	fmt.Fprintf(w, "fleet\t%s, host %s, interval %s\n", st.Name, st.Host, time.Duration(st.Interval))
	fmt.Fprintf(w, "redis\t%s\n", redis)
	if st.LastError != "" && !st.RedisUp {
		fmt.Fprintf(w, "last error\t%s\n", st.LastError)
	}
	last := "never"
	if !st.LastSync.IsZero() {
		last = fmt.Sprintf("%s (%s ago)", st.LastSync.UTC().Format(time.RFC3339), now.Sub(st.LastSync).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "last sync\t%s, %d syncs since the fleet started\n", last, st.Syncs)
	for _, m := range st.Members {
		me := ""
		if m.Host == st.Host {
			me = " (this host)"
		}
		fmt.Fprintf(w, "member\t%s%s, heartbeat %s ago\n", m.Host, me, now.Sub(m.LastSeen).Round(time.Millisecond))
	}
	l := st.Lists
	if !l.Enabled {
		fmt.Fprintf(w, "lists\tnot shared (fleet.lists: false)\n")
	} else {
		synced := "synced"
		if !l.Synced {
			synced = "NOT SYNCED (last copy in force)"
		}
		change := "none yet"
		if !l.LastChange.IsZero() {
			change = l.LastChange.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "lists\t%s, %d entries from other hosts, last change %s, lag %s\n", synced, l.Remote, change, time.Duration(l.Lag))
		fmt.Fprintf(w, "list changes\t%d published, %d applied, %d refused, %d malformed\n", l.Published, l.Applied, l.Refused, l.Malformed)
	}
	fmt.Fprintf(w, "aggregates\t%d scope: fleet aggregates active on this host\n", st.ActiveAggregates)
	if err := w.Flush(); err != nil {
		return err
	}
	if len(st.Shares) == 0 {
		return nil
	}
	fmt.Fprintln(out)
	t := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(t, "AGGREGATE\tBUDGET/s\tSHARE/s\tSHARE\tDEMAND/s\tFLEET DEMAND/s\tHOSTS\t\n")
	static := func(s control.FleetShare, f float64) string {
		if s.Static {
			return fmt.Sprintf("%.1f%% static", 100*f)
		}
		return fmt.Sprintf("%.1f%%", 100*f)
	}
	for _, s := range st.Shares {
		// A row per dimension the rule has: packets/s, then bytes/s.
		if s.Budget > 0 || s.ByteBudget <= 0 {
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", s.Aggregate, human(s.Budget), human(s.Share),
				static(s, s.Fraction), human(s.Demand), human(s.FleetDemand), s.Hosts)
		}
		if s.ByteBudget > 0 {
			fmt.Fprintf(t, "%s bytes\t%sB\t%sB\t%s\t%sB\t%sB\t%d\t\n", s.Aggregate, human(s.ByteBudget), human(s.ByteShare),
				static(s, s.ByteShare/s.ByteBudget), human(s.ByteDemand), human(s.FleetByteDemand), s.Hosts)
		}
	}
	return t.Flush()
}
