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

// edgectl bgp: the BGP speaker (docs/bgp.md).
func newBGPCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bgp",
		Short: "The BGP speaker: sessions, blackhole (RTBH) and FlowSpec announcements",
		Long: `The BGP speaker asks the upstream routers to drop a flood before it reaches this host's
link: a blackhole route (RFC 7999) for a destination, or a FlowSpec rule (RFC 8955/8956)
for a shield fingerprint. 'list' shows the sessions and every announcement with its origin,
reason and expiry (dry-run ones too); 'blackhole' announces one by hand; 'withdraw' takes
one (or all) back (docs/bgp.md).`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newBGPListCommand(), newBGPBlackholeCommand(), newBGPFlowSpecCommand(), newBGPWithdrawCommand())
	return cmd
}

func newBGPListCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show the BGP sessions and announcements",
		Args:  cobra.NoArgs,
	}
	addOutputFlag(cmd, &output)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		r, err := newClient(cmd).BGP(cmd.Context())
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r)
		}
		return writeBGP(cmd.OutOrStdout(), r)
	}
	return cmd
}

func newBGPBlackholeCommand() *cobra.Command {
	var output, reason string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "blackhole ADDR",
		Short: "Announce a blackhole route (RTBH) for an address or prefix until --ttl",
		Long: `Announces ADDR (an address: /32 or /128; a prefix only as wide as bgp.widths allows) with the
blackhole community (bgp.community, 65535:666 by default) to every neighbor carrying its
family, until --ttl (default bgp.blackhole.ttl). The guards apply: bgp.forbid, lists.allow and
lists.protected are refused, as is an announcement past bgp.max_announcements. With
bgp.dry_run (the default) it is listed and logged, not announced.`,
		Args: cobra.ExactArgs(1),
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long it stays announced (default bgp.blackhole.ttl; 1s to 168h)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the list and the audit log")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		if ttl < 0 {
			return usageError{fmt.Errorf("bad --ttl %s: use a positive duration", ttl)}
		}
		r, err := newClient(cmd).BGPDo(cmd.Context(), "blackhole", control.BGPRequest{Prefix: args[0], TTL: control.Duration(ttl),
			Reason: reason, By: operator()})
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r.Announcements)
		}
		return writeBGPAnnouncements(cmd.OutOrStdout(), r.Announcements)
	}
	return cmd
}

func newBGPFlowSpecCommand() *cobra.Command {
	var output, reason string
	var ttl time.Duration
	var f control.BGPFlowSpec
	cmd := &cobra.Command{
		Use:   "flowspec --dst ADDR [MATCH...]",
		Short: "Announce a FlowSpec rule (discard, or --rate) until --ttl",
		Long: `Announces a FlowSpec rule (RFC 8955; IPv6 RFC 8956) for traffic to --dst: the components given
(--src, --proto, --dport, --sport, --length, --tcp-flags, --fragment) must all match. The action
is discard, or with --rate a traffic-rate in bytes per second. The same guards as blackhole apply
to --dst and --src; a neighbor must carry ipv4-flowspec or ipv6-flowspec.`,
		Args: cobra.NoArgs,
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().StringVar(&f.Dst, "dst", "", "destination address or prefix (required)")
	cmd.Flags().StringVar(&f.Src, "src", "", "source prefix")
	cmd.Flags().StringVar(&f.Proto, "proto", "", "protocol: tcp, udp, icmp, icmpv6 or a number")
	cmd.Flags().Uint16Var(&f.DPort, "dport", 0, "destination port (tcp, udp)")
	cmd.Flags().Uint16Var(&f.SPort, "sport", 0, "source port (tcp, udp)")
	cmd.Flags().Uint16Var(&f.Length, "length", 0, "IP total length in bytes (IPv6: 40 + payload; announced as the payload length)")
	cmd.Flags().StringVar(&f.TCPFlags, "tcp-flags", "", "exactly these TCP flags, like 0x02 (SYN)")
	cmd.Flags().StringVar(&f.Fragment, "fragment", "", "not-a-fragment, is-fragment, first-fragment, last-fragment or dont-fragment")
	cmd.Flags().StringVar(&f.Rate, "rate", "", "traffic-rate instead of discard, like 1MB/s or 10Mbit/s")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long it stays announced (default bgp.blackhole.ttl; 1s to 168h)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the list and the audit log")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		if f.Dst == "" {
			return usageError{fmt.Errorf("flowspec needs --dst")}
		}
		if ttl < 0 {
			return usageError{fmt.Errorf("bad --ttl %s: use a positive duration", ttl)}
		}
		r, err := newClient(cmd).BGPDo(cmd.Context(), "flowspec", control.BGPRequest{FlowSpec: &f, TTL: control.Duration(ttl),
			Reason: reason, By: operator()})
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r.Announcements)
		}
		return writeBGPAnnouncements(cmd.OutOrStdout(), r.Announcements)
	}
	return cmd
}

func newBGPWithdrawCommand() *cobra.Command {
	var output string
	var all bool
	cmd := &cobra.Command{
		Use:   "withdraw ID | --all",
		Short: "Withdraw an announcement (the ID 'edgectl bgp list' shows), or all of them",
		Args:  cobra.MaximumNArgs(1),
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&all, "all", false, "withdraw every announcement")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		req := control.BGPRequest{All: all, By: operator()}
		switch {
		case all && len(args) == 0:
		case !all && len(args) == 1:
			id, err := strconv.ParseUint(strings.TrimPrefix(args[0], "#"), 10, 64)
			if err != nil || id == 0 {
				return usageError{fmt.Errorf("bad announcement id %q: use the ID 'edgectl bgp list' shows", args[0])}
			}
			req.ID = id
		default:
			return usageError{fmt.Errorf("withdraw takes one announcement ID or --all")}
		}
		r, err := newClient(cmd).BGPDo(cmd.Context(), "withdraw", req)
		if err != nil {
			return err
		}
		if output == "json" {
			return printJSON(cmd.OutOrStdout(), r.Announcements)
		}
		return writeBGPAnnouncements(cmd.OutOrStdout(), r.Announcements)
	}
	return cmd
}

func writeBGP(w io.Writer, r control.BGPReport) error {
	if !r.Enabled {
		_, err := fmt.Fprintln(w, "bgp: off (the policy has no bgp: section)")
		return err
	}
	mode := "announcing"
	if r.DryRun {
		mode = "dry run: nothing is announced"
	}
	fmt.Fprintf(w, "bgp: AS%d router %s, %s; community %s, at most %d announcements\n", r.LocalAS, r.RouterID, mode,
		r.Community, r.MaxAnnouncements)
	fmt.Fprintf(w, "destinations: %s\n", strings.Join(r.Destinations, ", "))
	if r.UplinkBps > 0 {
		fmt.Fprintf(w, "offered: %.0f bit/s; blackhole above %.0f bit/s\n", r.OfferedBps, r.UplinkBps)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "error: %s\n", r.Error)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nNEIGHBOR\tAS\tSTATE\tSINCE\tRECEIVED\tFAMILIES")
	for _, p := range r.Peers {
		since := "-"
		if !p.Uptime.IsZero() {
			since = p.Uptime.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d (%d kept)\t%s\n", p.Address, p.AS, p.State, since, p.Received, p.Accepted,
			strings.Join(p.Families, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return writeBGPAnnouncements(w, r.Announcements)
}

func writeBGPAnnouncements(w io.Writer, anns []control.BGPAnnouncement) error {
	if len(anns) == 0 {
		_, err := fmt.Fprintln(w, "no announcements")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tROUTE\tACTION\tSTATE\tORIGIN\tEXPIRES IN\tREASON")
	for _, a := range anns {
		state := a.State
		if a.Error != "" {
			state += " (" + a.Error + ")"
		}
		origin := a.Origin
		if a.By != "" {
			origin += " " + a.By
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.Route, a.Action, state, origin,
			time.Until(a.Expires).Round(time.Second), a.Reason)
	}
	return tw.Flush()
}
