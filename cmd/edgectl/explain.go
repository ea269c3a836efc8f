package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
)

func newExplainCommand() *cobra.Command {
	var q control.ExplainQuery
	var output string
	cmd := &cobra.Command{
		Use:   "explain ADDR",
		Short: "Say what the data plane would do with the next packet from an address, and why",
		Long: `Explain reads the running data plane's maps and decides the next packet from ADDR with
the reference model of the XDP program (the one the differential tests hold to it), fed with
that state: the deny or allow entry that covers it, its ASN and country, the rule it is charged
to and where that rule came from (prefix, ASN, country, default or an L4 rule), a fingerprint
rule it matches, every bucket on its path in the program's order (looked at, then charged)
with what is available in it now and the override (shield, fleet, cli) in force on it, the
class the decision gave the source, its standing, and the last drop samples the data plane
sent for it. When the policy protects TCP services (syn:), it also
says what the SYN path would do with a SYN from ADDR to each one (answered with a cookie,
passed as a validated source, dropped by the answer budget of its prefix, ...), what is
left of that budget, and the service's SYN counters. Nothing is charged or created.

--proto, --sport and --dport describe the packet for the L4 rules and fingerprints (without
--proto no L4 rule matches); --len the frame's size (byte limits; a fingerprint's len is the IP
length, --len minus 14); --ttl and --flags (the TCP flags byte) the fields fingerprints may
also match.

--pcap FILE decides every frame of a pcap or pcapng file (from 'edgectl capture' or tcpdump;
Ethernet only) and --frame HEX one frame, with the same model and the model's own frame parser:
the frames are replayed in file order on one private copy of the live state, so each frame
meets the buckets the frames before it filled, at the data plane's clock now plus its capture
time after the first frame's. One line per frame (verdict, reason, rule, and the verdict its
capture comment recorded), then totals by verdict and reason. A frame the capture cut short is
decided at its full length if its headers were captured, else it is "undecided (snap_length)".
--policy FILE decides them with a candidate policy instead of the running one (what-if).
Nothing is charged in the data plane.`,
		Args: cobra.MaximumNArgs(1),
	}
	asJSON := addJSONFlag(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&q.Proto, "proto", "", "the packet's protocol: tcp, udp, icmp or icmpv6")
	cmd.Flags().Uint16Var(&q.SPort, "sport", 0, "the packet's source port")
	cmd.Flags().Uint16Var(&q.DPort, "dport", 0, "the packet's destination port (ICMP: the type)")
	cmd.Flags().Uint32Var(&q.Len, "len", 64, "the frame's length in bytes")
	cmd.Flags().Uint8Var(&q.TTL, "ttl", 64, "the packet's TTL or hop limit")
	cmd.Flags().Uint8Var(&q.Flags, "flags", 0, "the TCP flags byte (e.g. 2 for a SYN)")
	var pcapFile, frameHex, policyFile string
	cmd.Flags().StringVar(&pcapFile, "pcap", "", "decide every frame of this pcap or pcapng file")
	cmd.Flags().StringVar(&frameHex, "frame", "", "decide this one Ethernet frame, in hex")
	cmd.Flags().StringVar(&policyFile, "policy", "", "with --pcap or --frame: decide with this candidate policy (what-if)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if output != "table" && output != "json" {
			return usageError{fmt.Errorf("bad --output %q: use table or json", output)}
		}
		if pcapFile != "" || frameHex != "" {
			if len(args) > 0 {
				return usageError{fmt.Errorf("--pcap and --frame take no address")}
			}
			req, err := framesRequest(pcapFile, frameHex, policyFile)
			if err != nil {
				return err
			}
			r, err := newClient(cmd).ExplainFrames(cmd.Context(), req)
			if err != nil {
				return err
			}
			if *asJSON || output == "json" {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printFrameReplay(cmd.OutOrStdout(), r)
			return nil
		}
		if policyFile != "" {
			return usageError{fmt.Errorf("--policy needs --pcap or --frame")}
		}
		if len(args) != 1 {
			return usageError{fmt.Errorf("explain needs an address, --pcap FILE or --frame HEX")}
		}
		ip, err := netip.ParseAddr(args[0])
		if err != nil {
			return usageError{fmt.Errorf("bad address %q: %w", args[0], err)}
		}
		q.IP = ip.String()
		e, err := newClient(cmd).Explain(cmd.Context(), q)
		if err != nil {
			return err
		}
		if *asJSON || output == "json" {
			return printJSON(cmd.OutOrStdout(), e)
		}
		printExplanation(cmd.OutOrStdout(), e)
		return nil
	}
	return cmd
}

func printExplanation(out io.Writer, e control.Explanation) {
	fmt.Fprintf(out, "%s: %s (%s)\n  %s\n\n", e.IP, e.Verdict, e.Reason, e.Why)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if e.List != nil {
		fmt.Fprintf(w, "list\t%s %s (%s", e.List.List, e.List.Prefix, e.List.Origin)
		if e.List.Reason != "" {
			fmt.Fprintf(w, ", %s", e.List.Reason)
		}
		if e.List.Expires != nil {
			fmt.Fprintf(w, ", until %s", e.List.Expires.UTC().Format(time.RFC3339))
		}
		fmt.Fprintln(w, ")")
	} else {
		fmt.Fprintln(w, "list\tnone")
	}
	fmt.Fprintf(w, "asn\t%s\n", asnLine(e.ASN))
	if e.Rule != nil {
		from := e.Rule.From
		if e.Rule.Match != "" {
			from += " " + e.Rule.Match
		}
		fmt.Fprintf(w, "rule\t%s (id %d, from %s; %s, %s)\n", e.Rule.Name, e.Rule.ID, from, e.Rule.Action, e.Rule.Mode)
	}
	if s := e.Standing; s != nil {
		line := s.Standing
		if s.Since != nil {
			line += " since " + s.Since.UTC().Format(time.RFC3339)
		}
		if s.Why != "" {
			line += " (" + s.Why + ")"
		}
		fmt.Fprintf(w, "standing\t%s\n", line)
		if r := s.Rate; r != nil {
			jumped := ""
			if r.Jumped {
				jumped = ", jumped (above jump_factor × usual: charged as new where the shield tightened)"
			}
			fmt.Fprintf(w, "rate\tusual %.4g/s, current %.4g/s (measured %.1fs ago)%s\n", r.Usual, r.Current, r.Measured, jumped)
		}
		if b := s.Budget; b != nil {
			fmt.Fprintf(w, "budget\tpersonal %.4g/s, burst %.4g packets; its next packet fills it to %.0f%%\n", b.Rate, b.Burst, 100*b.InUse)
		}
		if s.Next != "" {
			fmt.Fprintf(w, "next packet\tcharged as %s where an aggregate is in its reserve band\n", s.Next)
		}
	}
	if f := e.Fingerprint; f != nil {
		state := "its bucket has room"
		switch {
		case f.Dropped:
			state = "refused: dropped (fingerprint)"
		case f.Spared:
			state = "refused, but the source is validated: passed"
		case f.Refused:
			state = "refused (dry run: counted, passed)"
		}
		budget := "no budget: every match is refused"
		if f.Packets != nil {
			budget = fmt.Sprintf("%s, %s/%s available", f.Packets.Limit, human(f.Packets.Available), human(f.Packets.Burst))
		}
		until := "never expires"
		if f.Expires != nil {
			until = "until " + f.Expires.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "fingerprint	#%d %s (%s, %s; %s): %s\n", f.ID, f.Match, f.Origin, until, budget, state)
	}
	if e.Class != "" {
		fmt.Fprintf(w, "class	%s (as the decision saw the source)\n", e.Class)
	}
	printExplainSYN(w, e.SYN)
	for _, a := range e.Shield {
		fmt.Fprintf(w, "shield\t%s\n", shieldExplainLine(a))
	}
	printExplainL7(w, e.L7)
	w.Flush()
	if len(e.Buckets) > 0 {
		fmt.Fprintln(out)
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "STEP\tBUCKET\tKEY\tLIMIT\tAVAILABLE/BURST\tRESERVE\tADMITS")
		for _, b := range e.Buckets {
			key := b.Key
			if !b.Exists && b.Kind != "global" && key != "whole" {
				key += " (not in the table: full)"
			}
			if b.Uncharged {
				fmt.Fprintf(w, "%s\t%s\t%s\t-\tnew to the new-source filter: passes uncharged\t-\tyes\n", b.Step, b.Kind, key)
				continue
			}
			for _, l := range []struct {
				unit string
				l    *control.ExplainLevel
			}{{"packets", b.Packets}, {"bytes", b.Bytes}} {
				if l.l == nil {
					continue
				}
				rsv, admits := "-", yesNo(b.Admits)
				if l.l.Reserve > 0 {
					rsv = human(l.l.Reserve)
				}
				if b.Refused != "" && b.Refused != "budget" {
					admits = "no (" + b.Refused + ")"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s/%s %s\t%s\t%s\n", b.Step, b.Kind, key, l.l.Limit, human(l.l.Available), human(l.l.Burst), l.unit, rsv, admits)
			}
			if o := b.Override; o != nil {
				for _, p := range []struct {
					what string
					p    *control.ExplainOverridePart
				}{{"budget", o.Budget}, {"new sources", o.NewSource}} {
					if p.p == nil {
						continue
					}
					until := "never expires"
					if p.p.Expires != nil {
						until = "until " + p.p.Expires.UTC().Format(time.RFC3339)
					}
					avail := ""
					if p.p.Packets != nil {
						avail = fmt.Sprintf("%s/%s packets", human(p.p.Packets.Available), human(p.p.Packets.Burst))
					}
					charged := ""
					if p.what == "new sources" && b.NewSource {
						charged = " (this source is charged)"
					}
					fmt.Fprintf(w, "\t  override\t%s part by %s, %s%s\t%s\t%s\t\t\n", p.what, p.p.Origin, until, charged, p.p.Limit, avail)
				}
			}
		}
		w.Flush()
	}
	fmt.Fprintln(out)
	if len(e.Samples) == 0 {
		fmt.Fprintln(out, "no drop samples of this address in the daemon's memory")
		return
	}
	fmt.Fprintln(out, "last drop samples:")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TIME\tACTION\tREASON\tRULE\tPROTO\tSPORT\tDPORT\tLEN")
	for _, s := range e.Samples {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", s.Time.UTC().Format("15:04:05.000"), s.Action, s.Reason, s.Rule,
			s.Proto, s.SPort, s.DPort, s.Len)
	}
	w.Flush()
}

func asnLine(a control.ExplainASN) string {
	switch {
	case !a.Data:
		return "no ASN data loaded (the policy has no asn_data)"
	case !a.Found:
		return fmt.Sprintf("not in the ASN data (%d entries loaded)", a.Entries)
	}
	return fmt.Sprintf("AS%d %s (%s)", a.ASN, strings.TrimSpace(a.Country), a.Prefix)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newASNCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "asn", Short: "Look up IP-to-ASN data"}
	groupCommand(cmd)
	var data string
	lookup := &cobra.Command{
		Use:   "lookup IP",
		Short: "Show the ASN, country and rule of an address",
		Long: `Show the ASN, country and rule the running daemon gives an address (what 'edgectl explain'
says of it, in short): an address a deny or allow entry covers is decided by the list, before
any rule. With --data FILE it looks the address up in an iptoasn TSV (plain or gzip) or
MaxMind .mmdb file instead, without a daemon.`,
		Args: cobra.ExactArgs(1),
	}
	asJSON := addJSONFlag(lookup)
	lookup.Flags().StringVar(&data, "data", "", "look up in this ASN data file instead of asking the daemon")
	lookup.RunE = func(cmd *cobra.Command, args []string) error {
		ip, err := netip.ParseAddr(args[0])
		if err != nil {
			return usageError{fmt.Errorf("bad address %q: %w", args[0], err)}
		}
		ip = ip.Unmap()
		info := control.ASNInfo{IP: ip}
		var e control.Explanation
		if data != "" {
			t, err := asn.Load(cmd.Context(), []string{data}, asn.Options{Progress: progressBar(cmd.ErrOrStderr(), "loading "+data)})
			if err != nil {
				return err
			}
			en, ok := t.Lookup(ip)
			e.ASN = control.ExplainASN{Data: true, Entries: t.Len(), Found: ok}
			if ok {
				e.ASN.Prefix, e.ASN.ASN, e.ASN.Country = en.Prefix, en.ASN, asn.CountryString(en.Country)
			}
		} else {
			if e, err = newClient(cmd).Explain(cmd.Context(), control.ExplainQuery{IP: ip.String()}); err != nil {
				return err
			}
			if e.Rule != nil {
				info.Rule = e.Rule.Name
			}
			if e.List != nil {
				info.List = string(e.List.List)
			}
		}
		info.Found, info.Prefix, info.ASN, info.Country = e.ASN.Found, e.ASN.Prefix, e.ASN.ASN, e.ASN.Country
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), info)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s: %s", ip, asnLine(e.ASN))
		switch {
		case e.List != nil:
			fmt.Fprintf(cmd.OutOrStdout(), "; %s-listed by %s: no rule applies", e.List.List, e.List.Prefix)
		case info.Rule != "":
			fmt.Fprintf(cmd.OutOrStdout(), ", rule %s", info.Rule)
		}
		fmt.Fprintln(cmd.OutOrStdout())
		return nil
	}
	cmd.AddCommand(lookup)
	return cmd
}

// printExplainSYN adds the SYN path's lines: whether the source bypasses
// it, and per protected service what a SYN from the address gets (the
// SYN path's model, step by step), its answer budget and the service's
// counters.
func printExplainSYN(w io.Writer, x *control.ExplainSYN) {
	if x == nil {
		return
	}
	if !x.Available {
		fmt.Fprintf(w, "syn\tSYN path not loaded: %s\n", x.Unavailable)
		return
	}
	if x.Bypass {
		fmt.Fprintf(w, "syn\tvalidated source: its SYNs bypass the SYN path until %s\n", x.BypassUntil.UTC().Format(time.RFC3339))
	}
	for _, s := range x.Services {
		state := s.Protection
		if s.Active {
			state += ", on"
		} else {
			state += ", not on"
		}
		if s.Probe {
			state += "; the probe's port"
		}
		fmt.Fprintf(w, "syn %s\t%s: a SYN from here %s\n", s.Service, state, s.Next)
		for i, st := range s.Steps {
			fmt.Fprintf(w, "\t  %d. %s\n", i+1, st)
		}
		if s.ProbeSegment != "" {
			fmt.Fprintf(w, "\tthe probe: %s\n", s.ProbeSegment)
		}
		budget := "no answer budget read (none, or the decision stopped before it)"
		if s.AnswersBurst > 0 {
			budget = fmt.Sprintf("answers for %s: %s of %s left", s.AnswerPrefix, human(s.AnswersAvailable), human(s.AnswersBurst))
		}
		c := s.Counters
		fmt.Fprintf(w, "\t%s; service counters: %d SYNs, %d answered, %d answer-limited, %d cookies valid, %d invalid, "+
			"%d out-of-state dropped, %d validated passed\n",
			budget, c.SYNs, c.Answered, c.AnswerLimited, c.CookiesValid, c.CookiesInvalid, c.OutOfStateDropped, c.ValidatedPassed)
	}
}
