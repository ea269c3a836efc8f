package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// edgectl shield: the adaptive shield (docs/shield.md).
func newShieldCommand() *cobra.Command {
	var output string
	var n int
	cmd := &cobra.Command{
		Use:   "shield",
		Short: "Show the adaptive shield: baselines, current rates, surges and actions",
		Long: `Shows the adaptive shield's busiest aggregates (hot ones first) with their learned baseline,
current rate, the factor between them, their surge state and the action taken on them,
then the actions and the forbidden aggregates. The subcommands list, release and pin
actions and forbid aggregates (docs/shield.md).`,
		Args: cobra.NoArgs,
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().IntVarP(&n, "number", "n", 20, "how many aggregates to show")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		if n <= 0 {
			return usageError{fmt.Errorf("bad -n %d: use a positive number", n)}
		}
		r, err := newClient(cmd).Shield(cmd.Context(), n)
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r)
		}
		return writeShield(cmd.OutOrStdout(), r)
	}
	cmd.AddCommand(newShieldListCommand(), newShieldActCommand("release", "Remove an action now; its aggregate is left alone until that surge ends"),
		newShieldActCommand("pin", "Keep an action in force after its surge ends, until released"), newShieldForbidCommand())
	return cmd
}

func addOutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "table", "output format: table or json")
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return usageError{fmt.Errorf("bad --output %q: use table or json", o)}
	}
	return nil
}

func newShieldListCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the shield's actions (in force, or decided in mode monitor)",
		Args:  cobra.NoArgs,
	}
	addOutputFlag(cmd, &output)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		r, err := newClient(cmd).Shield(cmd.Context(), 1)
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r.Actions)
		}
		return writeShieldActions(cmd.OutOrStdout(), r.Actions)
	}
	return cmd
}

// operator names who asks, for the audit log.
func operator() string {
	return cmp.Or(os.Getenv("SUDO_USER"), os.Getenv("USER"))
}

func newShieldActCommand(verb, short string) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
	}
	addOutputFlag(cmd, &output)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		id, err := strconv.ParseUint(strings.TrimPrefix(args[0], "#"), 10, 32)
		if err != nil || id == 0 {
			return usageError{fmt.Errorf("bad action id %q: use the ID 'edgectl shield list' shows", args[0])}
		}
		r, err := newClient(cmd).ShieldDo(cmd.Context(), verb, control.ShieldRequest{ID: uint32(id), By: operator()})
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r.Actions)
		}
		past := map[string]string{"release": "released", "pin": "pinned"}[verb]
		fmt.Fprintf(cmd.OutOrStdout(), "action %d %s\n", id, past)
		return writeShieldActions(cmd.OutOrStdout(), r.Actions)
	}
	return cmd
}

func newShieldForbidCommand() *cobra.Command {
	var output string
	var remove bool
	cmd := &cobra.Command{
		Use:   "forbid AGGREGATE",
		Short: "Never let the shield touch an aggregate (prefix, ASN or aggregate); --remove lifts it",
		Long: `Forbids the shield to act on AGGREGATE from now on, and removes its actions that touch it:
a prefix (198.51.100.0/24: every prefix aggregate and source-prefix fingerprint that overlaps it),
an ASN (AS64500), or one aggregate as 'edgectl shield' names it ("rule 0 asn 64500",
"port udp/53", "global"). Forbids survive restarts (state directory); those in the
policy's shield.forbid cannot be lifted here.`,
		Args: cobra.ExactArgs(1),
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&remove, "remove", false, "lift an operator's forbid")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		if _, err := shield.ParseForbid(args[0]); err != nil {
			return usageError{err} // checked here as the daemon does: a mistyped aggregate is a usage error
		}
		r, err := newClient(cmd).ShieldDo(cmd.Context(), "forbid", control.ShieldRequest{Aggregate: args[0], Remove: remove, By: operator()})
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r.Forbid)
		}
		for _, f := range r.Forbid {
			fmt.Fprintf(cmd.OutOrStdout(), "forbidden  %s\n", f)
		}
		return nil
	}
	return cmd
}

func rate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func writeShield(out io.Writer, r control.ShieldReport) error {
	fmt.Fprintf(out, "shield: mode %s, %d/%d aggregates tracked, %d surges", r.Mode, r.Tracked, r.Capacity, r.Surges)
	if r.WouldDrop > 0 {
		fmt.Fprintf(out, ", ~%.0f packets would have been dropped (monitor)", r.WouldDrop)
	}
	fmt.Fprintln(out)
	if len(r.Aggregates) > 0 {
		fmt.Fprintln(out)
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "AGGREGATE\tBASELINE PPS\tRATE PPS\tFACTOR\tBASELINE BIT/S\tSTATE\tLEARNED\tACTION")
		for _, a := range r.Aggregates {
			base, factor := rate(a.Baseline), fmt.Sprintf("%.1fx", a.Factor)
			if !a.Judged {
				base, factor = "learning", "-"
				if a.LearningPaused {
					base = "learning (paused: surge)"
				}
			}
			act := "-"
			if a.Action != 0 {
				act = "#" + strconv.FormatUint(uint64(a.Action), 10)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Aggregate, base, rate(a.Rate), factor, rate(a.BaselineBits),
				a.State, time.Duration(a.Learned).Round(time.Second), act)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(out)
	if err := writeShieldActions(out, r.Actions); err != nil {
		return err
	}
	for _, f := range r.Forbid {
		fmt.Fprintf(out, "forbidden  %s\n", f)
	}
	return nil
}

func writeShieldActions(out io.Writer, acts []control.ShieldAction) error {
	if len(acts) == 0 {
		_, err := fmt.Fprintln(out, "no shield actions")
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tKIND\tAGGREGATE\tMATCH\tBUDGET PPS\tBASELINE PPS\tENFORCED\tEXPIRES\tREASON")
	for _, a := range acts {
		match := cmp.Or(a.Fingerprint, "new sources")
		enf := "yes"
		if !a.Enforced {
			enf = "no (monitor)"
		}
		exp := a.Expires.UTC().Format(time.RFC3339)
		if a.Pinned {
			exp += " (pinned by " + a.PinnedBy + ")"
		}
		fmt.Fprintf(w, "#%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.Aggregate, match, rate(a.Budget), rate(a.Baseline), enf, exp, a.Reason)
	}
	return w.Flush()
}

// shieldExplainLine is one shield action on an explained packet's path.
func shieldExplainLine(a control.ShieldAction) string {
	what := "new sources of " + a.Aggregate + " share " + rate(a.Budget) + "/s"
	if a.Fingerprint != "" {
		what = "fingerprint " + a.Fingerprint + " (from " + a.Aggregate + ") limited to " + rate(a.Budget) + "/s"
	}
	state := "in force until " + a.Expires.UTC().Format(time.RFC3339)
	if !a.Enforced {
		state = "monitor: not enforced"
	}
	return fmt.Sprintf("#%d %s: %s; %s", a.ID, a.Kind, what, state)
}

// writeSamplerStats prints the 1-in-N sampler's part of `edgectl stats`.
func writeSamplerStats(out io.Writer, st *control.SamplerStats) error {
	if st == nil {
		return nil
	}
	if st.OneIn == 0 {
		fmt.Fprintf(out, "\nsampler: off (sampling.one_in 0)")
	} else {
		fmt.Fprintf(out, "\nsampler: 1 in %d, at most %d/s", st.OneIn, st.MaxPerSecond)
	}
	if st.Error != "" {
		_, err := fmt.Fprintf(out, "; counters unreadable: %s\n", st.Error)
		return err
	}
	_, err := fmt.Fprintf(out, "; chosen %d: sent %d, capped %d, lost (ring buffer full) %d; daemon read %d, shield queue full %d\n",
		st.Chosen, st.Sent, st.Capped, st.Lost, st.Read, st.Dropped)
	return err
}
