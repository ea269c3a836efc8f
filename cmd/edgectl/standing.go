package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

// congestionLine is one aggregate kind's congestion state for status.
func congestionLine(c control.Congestion) string {
	if !c.Congested {
		return fmt.Sprintf("%s: not congested", c.Aggregate)
	}
	return fmt.Sprintf("%s: CONGESTED (refusing new sources) since %s, for %s; admitted %s",
		c.Aggregate, c.Since.Format(time.RFC3339), time.Duration(c.For).Round(time.Second), classShares(c.AdmittedByClass))
}

// instanceLine is one congested aggregate instance for status and stats.
func instanceLine(c control.CongestedInstance) string {
	name := c.Aggregate
	switch {
	case c.Aggregate == "asn":
		name = fmt.Sprintf("rule %s asn AS%d", c.Rule, c.ASN)
	case c.Prefix != "":
		name = fmt.Sprintf("rule %s prefix %s", c.Rule, c.Prefix)
	}
	over := ""
	if c.Overcount > 0 {
		over = fmt.Sprintf(" (up to %d of them other instances')", c.Overcount)
	}
	return fmt.Sprintf("%s: REFUSING since %s, for %s; sampled refusals %d by the reserve, %d full%s, %.1f%% of the %s kind's; refused %s; decided by %s",
		name, c.Since.Format(time.RFC3339), time.Duration(c.For).Round(time.Second), c.RefusedReserve, c.RefusedFull, over,
		100*c.Share, c.Aggregate, classShares(c.RefusedByClass), classShares(c.RefusedByReason))
}

func classShares(m map[string]uint64) string {
	var total uint64
	keys := make([]string, 0, len(m))
	for k, v := range m {
		keys = append(keys, k)
		total += v
	}
	if total == 0 {
		return "nothing"
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f%%", k, 100*float64(m[k])/float64(total)))
	}
	return strings.Join(parts, ", ")
}

// writeStanding is the standing section of edgectl stats.
func writeStanding(out io.Writer, s *control.StandingStats) error {
	if s == nil {
		return nil
	}
	fmt.Fprintln(out)
	for _, c := range s.Congestion {
		fmt.Fprintf(out, "congestion  %s\n", congestionLine(c))
	}
	for _, c := range s.Instances {
		fmt.Fprintf(out, "congested   %s\n", instanceLine(c))
	}
	ev := s.Events
	fmt.Fprintf(out, "standing    %d entered, %d not entered (table full), %d established, %d penalised\n",
		ev["created"], ev["table_full"], ev["established"], ev["penalised"])
	if len(s.Classes) == 0 {
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "AGGREGATE\tCLASS\tOUTCOME\tMODE\tPACKETS\tBYTES\t\n")
	for _, c := range s.Classes {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t\n", c.Aggregate, c.Class, c.Outcome, c.Mode, c.Packets, c.Bytes)
	}
	return w.Flush()
}
