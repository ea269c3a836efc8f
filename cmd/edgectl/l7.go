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

// writeL7Status is the L7 stage's line of `edgectl status` (nothing when
// the policy has no l7: section): the engine serving, where, to what, and
// the routes in match order.
func writeL7Status(w io.Writer, l7 *control.L7Status) {
	if l7 == nil {
		fmt.Fprintf(w, "l7 stage\toff\n")
		return
	}
	routes := "no routes"
	if len(l7.Routes) > 0 {
		routes = fmt.Sprintf("routes %s", strings.Join(l7.Routes, ", "))
	}
	if l7.Engine != "" {
		fmt.Fprintf(w, "l7 stage\t%s engine on %s, upstream %s, %s\n", l7.Engine, l7.Listen, l7.Upstream, routes)
	} else {
		fmt.Fprintf(w, "l7 stage\tno proxy (rate-limit service only)\n")
	}
	if len(l7.RLS) > 0 {
		var parts []string
		for _, k := range []string{"grpc", "grpc+tls", "unix", "http"} {
			if a, ok := l7.RLS[k]; ok {
				parts = append(parts, k+" "+a)
			}
		}
		fmt.Fprintf(w, "l7 rls\t%s\n", strings.Join(parts, ", "))
	}
	if l7.AccessLogReopenFailed != "" {
		fmt.Fprintf(w, "l7 access log\tREOPEN FAILED at %s; still writing the old file\n", l7.AccessLogReopenFailed)
	}
	if l7.Engine == "" {
		return
	}
	if l7.Classes == nil {
		fmt.Fprintf(w, "l7 classes\toff (l7.classes.enabled: false)\n")
		return
	}
	parts := make([]string, 0, len(l7.Classes))
	for _, c := range l7.Classes {
		parts = append(parts, fmt.Sprintf("%s %d/%d", c.Class, c.Admitted, c.Admitted+c.Refused))
	}
	fmt.Fprintf(w, "l7 classes\tadmitted/requests: %s\n", strings.Join(parts, ", "))
}

// writeL7Stats is the L7 part of `edgectl stats` (nothing without an L7
// stage): requests by route and decision since the stage's last reload.
func writeL7Stats(out io.Writer, routes []control.L7RouteStat, classes []control.L7ClassStat) error {
	if len(routes) == 0 {
		return nil
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "L7 ROUTE\tALLOWED\tLIMITED\tSHED\tESCALATED\t\n")
	for _, r := range routes {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t\n", r.Route, r.Allowed, r.Limited, r.Shed, r.Escalated)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "(l7 requests since the l7 section was last loaded)")
	if len(classes) == 0 {
		return nil
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "L7 CLASS\tADMITTED\tREFUSED\t\n")
	for _, c := range classes {
		fmt.Fprintf(w, "%s\t%d\t%d\t\n", c.Class, c.Admitted, c.Refused)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "(l7 requests by client class since the daemon started; docs/operations.md, \"Class ranking at L7\")")
	return nil
}

// newL7Command is `edgectl l7`: the L7 stage's commands.
func newL7Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "l7",
		Short: "The L7 stage: explain a rate-limit service decision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{fmt.Errorf("want a subcommand: explain")}
		},
	}
	cmd.AddCommand(newL7ExplainCommand())
	return cmd
}

func newL7ExplainCommand() *cobra.Command {
	var domain string
	var descriptors []string
	cmd := &cobra.Command{
		Use:   "explain --domain DOMAIN --descriptor KEY=VALUE[,KEY=VALUE...] ...",
		Short: "Say what the rate-limit service would answer for a set of descriptors, and why",
		Long: `Explain asks the running daemon's rate-limit service (l7 rls:) what it would answer now
for DOMAIN and the descriptors given (one --descriptor per descriptor, its entries in order,
as Envoy sends them): the rule each descriptor matches, its tier, the key it is counted
under, and every limit with what remains of it. Nothing is charged. Limits kept in Redis are
listed but not read.`,
		Args: cobra.NoArgs,
	}
	asJSON := addJSONFlag(cmd)
	cmd.Flags().StringVar(&domain, "domain", "", "the rate-limit domain (Envoy's filter domain)")
	cmd.Flags().StringArrayVar(&descriptors, "descriptor", nil, "a descriptor: KEY=VALUE[,KEY=VALUE...] (repeat for several)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if domain == "" || len(descriptors) == 0 {
			return usageError{fmt.Errorf("want --domain and at least one --descriptor")}
		}
		e, err := newClient(cmd).ExplainRLS(cmd.Context(), domain, descriptors)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), e)
		}
		printRLSExplanation(cmd.OutOrStdout(), e)
		return nil
	}
	return cmd
}

func printRLSExplanation(out io.Writer, e control.RLSExplanation) {
	verdict := "OK (the next request passes its local limits)"
	if !e.Allowed {
		verdict = "OVER_LIMIT (a local limit has no room)"
	}
	fmt.Fprintf(out, "domain %s: %s\n", e.Domain, verdict)
	if e.Class != "" {
		fmt.Fprintf(out, "client %s: next request charged as %s\n", e.Client, e.Class)
	}
	for _, d := range e.Descriptors {
		if d.Rule == "" {
			fmt.Fprintf(out, "descriptor [%s]: no rule matches: not limited (OK)\n", d.Entries)
			continue
		}
		tier := ""
		if d.Tier != "" {
			tier = ", tier " + d.Tier
		}
		fmt.Fprintf(out, "descriptor [%s]: rule %s%s, key %s\n", d.Entries, d.Rule, tier, d.Key)
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "  LIMIT\tRATE\tBACKEND\tREMAINING\tRESET\t\n")
		for _, l := range d.Limits {
			name := l.Name
			if l.Shadow {
				name += " (shadow)"
			}
			if !l.Read {
				fmt.Fprintf(w, "  %s\t%s\t%s\t(in redis, not read)\t\t\n", name, l.Rate, l.Backend)
				continue
			}
			remaining := strconv.FormatInt(l.Remaining, 10)
			if l.Reserve > 0 {
				remaining += fmt.Sprintf(" (reserve %d)", l.Reserve)
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t\n", name, l.Rate, l.Backend, remaining, time.Duration(l.Reset))
		}
		_ = w.Flush()
	}
}

// printExplainL7 is the L7 class ranking's line of `edgectl explain`:
// the class the address's next request would be charged as, its L7
// history and its personal budget (nothing without a ranking).
func printExplainL7(w io.Writer, x *control.ExplainL7) {
	if x == nil {
		return
	}
	if !x.Tracked {
		fmt.Fprintf(w, "l7 class\tnext request: %s (not seen by the L7 stage)\n", x.Next)
		return
	}
	history := "no L7 history"
	if x.History {
		history = "L7 history"
	}
	budget := fmt.Sprintf("default budget %d", x.Budget)
	if x.Learned {
		budget = fmt.Sprintf("budget %d: headroom × usual %d + clump %d", x.Budget, x.Usual, x.Clump)
	}
	fmt.Fprintf(w, "l7 class\tnext request: %s (%s; %d requests in this %gs window, %s)\n",
		x.Next, history, x.InWindow, x.Window, budget)
}
