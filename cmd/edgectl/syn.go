package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/edgeguard/edgeguard/internal/control"
)

// writeSynStats prints the SYN path's part of `edgectl stats`.
func writeSynStats(out io.Writer, st *control.SYNStats) error {
	if st == nil {
		return nil
	}
	if !st.Available {
		_, err := fmt.Fprintf(out, "\nsyn protection: off (%s)\n", st.Unavailable)
		return err
	}
	if st.Error != "" {
		_, err := fmt.Fprintf(out, "\nsyn protection: counters unreadable: %s\n", st.Error)
		return err
	}
	if len(st.Services) == 0 {
		_, err := fmt.Fprintf(out, "\nsyn protection: loaded, no protected service (policy syn: section)\n")
		return err
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "SYN SERVICE\tACTIVE\tSYNS\tANSWERED\tCOOKIES OK\tCOOKIES BAD\tOUT-OF-STATE DROPPED\tREQUESTS\tFAILED\t\n")
	for _, s := range st.Services {
		active := "no"
		if s.Active {
			active = "yes"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", s.Service, active, s.SYNs, s.Answered,
			s.CookiesValid, s.CookiesInvalid, s.OutOfStateDropped, s.Requests, s.RequestFailures)
	}
	return w.Flush()
}
