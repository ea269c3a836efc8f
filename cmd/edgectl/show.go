package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
)

func newShowCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "show",
		Short: "List everything installed in the data plane besides the policy's rules, from its maps",
		Long: `Show reads the data plane's pinned maps and lists what decides packets besides the
policy's rules: every list entry (deny and allow, with its origin and expiry), every part of
every aggregate override (the shield's tighten, fleet mode's share, or an operator's, with its
origin, expiry and the aggregate's counters when it is watched) and every fingerprint rule with
its mask slot and counters, and the mask slots in use. It shows what is in force, whoever wrote
it and whether or not the daemon that wrote it is still running (an entry a crashed daemon left
is listed until it expires). It also lists what Edgeguard installed at the routers: the BGP
speaker's announcements (blackholes and FlowSpec rules, with origin, reason, expiry and state:
announced, dry-run or failed), read from the running speaker. Each row names the command that
removes it.`,
		Args: cobra.NoArgs,
	}
	addOutputFlag(cmd, &output)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		inv, err := newClient(cmd).Inventory(cmd.Context())
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), inv)
		}
		return writeInventory(cmd.OutOrStdout(), inv)
	}
	cmd.AddCommand(newShowRemoveCommand())
	return cmd
}

func newShowRemoveCommand() *cobra.Command {
	var origin string
	cmd := &cobra.Command{
		Use:   "remove override AGGREGATE --origin ORIGIN | remove fingerprint ID | remove bgp ID",
		Short: "Remove one override's parts of an origin, one fingerprint, or one BGP announcement",
		Long: `Remove takes one entry 'edgectl show' lists out of the data plane: the parts of an
aggregate's override one origin wrote (AGGREGATE as show prints it: "rule 3 asn 64500",
"rule 2 prefix 198.18.4.0/24", "rule 2 whole", "global"), or a fingerprint by its id. What the
shield holds as an action is released through the shield (as 'edgectl shield release' does),
so it is not written again for this surge; fleet mode writes its share again at its next
interval while the fleet runs. 'remove bgp ID' withdraws one BGP announcement (as 'edgectl bgp
withdraw ID' does; the automatic uplink blackhole is announced again while the offered rate stays
above its threshold). List entries are removed with 'edgectl deny|allow del'.`,
		Args: cobra.ExactArgs(2),
	}
	cmd.Flags().StringVar(&origin, "origin", "", "the override parts' writer: shield, fleet or cli")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		req := control.RemoveRequest{Kind: args[0], By: operator()}
		switch args[0] {
		case "override":
			if origin == "" {
				return usageError{fmt.Errorf("remove override: give --origin (shield, fleet or cli)")}
			}
			req.Aggregate, req.Origin = args[1], origin
		case "fingerprint":
			id, err := strconv.ParseUint(strings.TrimPrefix(args[1], "#"), 10, 32)
			if err != nil || id == 0 {
				return usageError{fmt.Errorf("bad fingerprint id %q", args[1])}
			}
			req.ID = uint32(id)
		case "bgp":
			id, err := strconv.ParseUint(strings.TrimPrefix(args[1], "#"), 10, 64)
			if err != nil || id == 0 {
				return usageError{fmt.Errorf("bad announcement id %q: use the ID 'edgectl show' lists", args[1])}
			}
			req.Announcement = id
		default:
			return usageError{fmt.Errorf("remove %q: use override, fingerprint or bgp", args[0])}
		}
		res, err := newClient(cmd).Remove(cmd.Context(), req)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "removed %s", res.Removed)
		if res.Note != "" {
			fmt.Fprintf(cmd.OutOrStdout(), " (%s)", res.Note)
		}
		fmt.Fprintln(cmd.OutOrStdout())
		return nil
	}
	return cmd
}

func until(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

func writeInventory(out io.Writer, inv control.Inventory) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "lists (%d)\n", len(inv.Lists))
	if len(inv.Lists) > 0 {
		fmt.Fprintln(w, "LIST\tPREFIX\tORIGIN\tEXPIRES\tREMOVE")
		for _, l := range inv.Lists {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", l.List, l.Prefix, l.Origin, until(l.Expires), l.Remove)
		}
	}
	fmt.Fprintf(w, "\noverrides (%d parts)\n", len(inv.Overrides))
	if len(inv.Overrides) > 0 {
		fmt.Fprintln(w, "AGGREGATE\tRULE\tPART\tORIGIN\tLIMIT\tEXPIRES\tPASSED\tDROPPED\tREMOVE")
		for _, o := range inv.Overrides {
			passed, dropped := "-", "-"
			if o.Passed != nil {
				passed, dropped = strconv.FormatUint(o.Passed.Packets, 10), strconv.FormatUint(o.Dropped.Packets, 10)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Aggregate, o.Rule, o.Part, o.Origin, o.Limit, until(o.Expires),
				passed, dropped, o.Remove)
		}
	}
	fmt.Fprintf(w, "\nfingerprints (%d)\n", len(inv.Fingerprints))
	if len(inv.Fingerprints) > 0 {
		fmt.Fprintln(w, "ID\tMATCH\tSLOT\tORIGIN\tLIMIT\tEXPIRES\tMATCHED\tDROPPED\tSPARED\tREMOVE")
		for _, f := range inv.Fingerprints {
			limit := f.Limit
			if limit == "" {
				limit = "none: every match refused"
			}
			if f.DryRun {
				limit += " (dry run)"
			}
			fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", f.ID, f.Match, f.Slot, f.Origin, limit, until(f.Expires),
				f.Matched.Packets, f.Dropped.Packets, f.Spared.Packets, f.Remove)
		}
	}
	fmt.Fprintf(w, "\nfingerprint mask slots in use (%d)\n", len(inv.Masks))
	if len(inv.Masks) > 0 {
		fmt.Fprintln(w, "SLOT\tFIELDS\tSRC_LEN\tFINGERPRINTS")
		for _, m := range inv.Masks {
			fmt.Fprintf(w, "%d\t%s\t%d\t%d\n", m.Slot, m.Fields, m.SrcLen, m.Fingerprints)
		}
	}
	fmt.Fprintf(w, "\nbgp announcements, at the routers (%d)\n", len(inv.BGP))
	if len(inv.BGP) > 0 {
		fmt.Fprintln(w, "ID\tKIND\tROUTE\tACTION\tSTATE\tORIGIN\tEXPIRES\tREASON\tREMOVE")
		for _, a := range inv.BGP {
			state := a.State
			if a.Error != "" {
				state += ": " + a.Error
			}
			exp := until(&a.Expires)
			if a.Expires.IsZero() {
				exp = until(nil)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.Route, a.Action, state, a.Origin, exp, a.Reason, a.Remove)
		}
	}
	return w.Flush()
}
