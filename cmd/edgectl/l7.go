package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/edgeguard/edgeguard/internal/control"
)

// writeL7Status is the L7 stage's line of `edgectl status` (nothing when
// the policy has no l7: section): the engine serving, where, to what, and
// the routes in match order.
func writeL7Status(w io.Writer, l7 *control.L7Status) {
	if l7 == nil {
		return
	}
	routes := "no routes"
	if len(l7.Routes) > 0 {
		routes = fmt.Sprintf("routes %s", strings.Join(l7.Routes, ", "))
	}
	fmt.Fprintf(w, "l7 stage\t%s engine on %s, upstream %s, %s\n", l7.Engine, l7.Listen, l7.Upstream, routes)
}
