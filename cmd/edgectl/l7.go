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
	if l7.AccessLogReopenFailed != "" {
		fmt.Fprintf(w, "l7 access log\tREOPEN FAILED at %s; still writing the old file\n", l7.AccessLogReopenFailed)
	}
}

// writeL7Stats is the L7 part of `edgectl stats` (nothing without an L7
// stage): requests by route and decision since the stage's last reload.
func writeL7Stats(out io.Writer, routes []control.L7RouteStat) error {
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
	return nil
}
