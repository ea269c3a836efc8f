package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

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
	fmt.Fprintf(w, "l7 stage\t%s engine on %s, upstream %s, %s\n", l7.Engine, l7.Listen, l7.Upstream, routes)
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
