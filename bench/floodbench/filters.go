package main

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

// The per-source limit every limiter gets: 100 packets/s, burst 100.
const (
	perSourceRate  = 100
	perSourceBurst = 100
	// meterSize is the nft set and hashlimit table capacity (their
	// usual order of magnitude; nft's default for a dynamic set is 65535).
	meterSize = 65536
	// Edgeguard's aggregate budgets (see policy).
	prefixBudget  = 1000  // packets/s per /16 of the known space
	unknownBudget = 10000 // packets/s for all sources outside it
)

// filter is one contender on the edge namespace's two veths (the flood
// interface and the legit clients' interface).
type filter interface {
	name() string
	// setup installs it; extra is a number of additional rules (0: none).
	setup(e *edge, extraRules int) error
	// dropped is how many flood packets it dropped so far.
	dropped(e *edge) (uint64, error)
	close()
}

// edge is the receiving side: its namespace and interfaces.
type edge struct {
	ns        *testbed.Namespace
	floodIf   testbed.Endpoint // receives the flood (threaded NAPI, measured)
	legitIf   testbed.Endpoint // receives the legit clients
	floodAddr netip.Addr
}

// enableSkbNAPI turns GRO on so a veth without an XDP program still has
// NAPI: frames sent with XDP_TX from the peer are then accepted (veth's
// ndo_xdp_xmit needs the receiver's NAPI) and become skbs.
func (e *edge) enableSkbNAPI() error {
	_, err := nsExec(e.ns, "", "ethtool", "-K", e.floodIf.Name, "gro", "on")
	return err
}

// attachXDP attaches p to iface in the edge namespace.
func (e *edge) attachXDP(p *ebpf.Program, ifindex int, flags link.XDPAttachFlags) (link.Link, error) {
	var l link.Link
	err := e.ns.Do(func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: p, Interface: ifindex, Flags: flags})
		return err
	})
	return l, err
}

// xdpConst is a one-instruction XDP program: XDP_DROP is the floor.
type xdpConst struct {
	prog  *ebpf.Program
	links []link.Link
	sent  func() uint64
}

func (x *xdpConst) name() string { return "xdp-drop (floor)" }
func (x *xdpConst) setup(e *edge, _ int) error {
	p, err := constProgram("floor_drop", xdpDrop)
	if err != nil {
		return err
	}
	x.prog = p
	l, err := e.attachXDP(p, e.floodIf.Index, link.XDPDriverMode)
	if err != nil {
		return fmt.Errorf("attach xdp drop to %s: %w", e.floodIf.Name, err)
	}
	x.links = append(x.links, l)
	return nil
}

// dropped: every packet that reached it.
func (x *xdpConst) dropped(e *edge) (uint64, error) {
	s, err := linkStats(e)
	return s.rxPackets, err
}
func (x *xdpConst) close() {
	for _, l := range x.links {
		l.Close()
	}
	if x.prog != nil {
		x.prog.Close()
	}
}

// stackOnly has no filter: the skb path to the sink socket, for reference.
type stackOnly struct{}

func (stackOnly) name() string                  { return "no filter (skb path)" }
func (stackOnly) setup(e *edge, _ int) error    { return e.enableSkbNAPI() }
func (stackOnly) dropped(*edge) (uint64, error) { return 0, nil }
func (stackOnly) close()                        {}

// edgeguard is our data plane, native or generic, on both interfaces.
type edgeguard struct {
	mode  loader.Mode
	clock policy.Clock
	dp    *loader.Datapath
	m     *maps.Maps
	att   []*loader.Attachment
}

func (g *edgeguard) name() string {
	if g.clock == policy.ClockPrecise {
		return "edgeguard " + string(g.mode) + ", precise clock"
	}
	return "edgeguard " + string(g.mode)
}

// policy: the default rule (sources in no prefix fact, i.e. the rest of
// the internet) limits each source to 100/s and all of them together to
// unknownBudget; the known space 198.18.0.0/15 (standing for networks the
// operator has facts about, as from an ASN database) limits each source
// to 100/s and each /16 to prefixBudget. No rule names the attacker.
func benchPolicy(extraRules int, clock policy.Clock) *policy.Compiled {
	src := policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: perSourceRate, Per: time.Second}, Burst: perSourceBurst}}
	g := policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Clock:     clock,
		Rules: []policy.CompiledRule{
			{
				ID:        0,
				SourceKey: policy.KeyBits{V4: 32, V6: 64},
				PerSource: src,
				Aggregate: policy.AggregateWhole,
				PerPrefix: policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: unknownBudget, Per: time.Second}, Burst: unknownBudget}},
			},
			{
				ID:           1,
				SourceKey:    policy.KeyBits{V4: 32, V6: 64},
				PerSource:    src,
				Aggregate:    policy.AggregateDerived,
				AggregateKey: policy.KeyBits{V4: 16, V6: 48},
				PerPrefix:    policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: prefixBudget, Per: time.Second}, Burst: prefixBudget}},
			},
		},
		Prefixes: []policy.PrefixFact{{Prefix: netip.MustParsePrefix("198.18.0.0/15"), RuleID: 1}},
	}
	// Extra rules, each with its own /32 in 240.0.0.0/8 (reserved, never a
	// source here), none matching the flood: the cost of a bigger policy.
	for i := 0; i < extraRules; i++ {
		id := uint32(2 + i%1000)
		if i < 1000 {
			g.Rules = append(g.Rules, policy.CompiledRule{ID: id, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: src})
		}
		a := netip.AddrFrom4([4]byte{240, byte(i >> 16), byte(i >> 8), byte(i)})
		g.Prefixes = append(g.Prefixes, policy.PrefixFact{Prefix: netip.PrefixFrom(a, 32), RuleID: id})
	}
	return &g
}

func (g *edgeguard) setup(e *edge, extraRules int) error {
	dp, err := loader.Load(loader.Options{})
	if err != nil {
		return err
	}
	g.dp, g.m = dp, maps.New(dp)
	if err := mapstest.StageCommit(g.m, benchPolicy(extraRules, g.clock)); err != nil {
		return fmt.Errorf("apply bench policy: %w", err)
	}
	if g.mode == loader.ModeGeneric {
		if err := e.enableSkbNAPI(); err != nil {
			return err
		}
	}
	for _, ifc := range []string{e.floodIf.Name, e.legitIf.Name} {
		err := e.ns.Do(func() error {
			a, err := dp.Attach(ifc, g.mode)
			if err == nil {
				g.att = append(g.att, a)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (g *edgeguard) dropped(e *edge) (uint64, error) {
	slots, err := g.m.Counters.BySlot()
	if err != nil {
		return 0, err
	}
	c := slots[g.att[0].Slot]
	return c.Total(maps.ActDrop).Packets, nil
}

func (g *edgeguard) close() {
	for _, a := range g.att {
		a.Detach()
	}
	if g.dp != nil {
		g.dp.Close()
	}
}

// nftMeter is a per-source nft meter, in a netdev ingress chain on both
// interfaces or in an ip prerouting chain at raw priority (before
// conntrack, which is never loaded here).
type nftMeter struct{ netdev bool }

func (n nftMeter) name() string {
	if n.netdev {
		return "nft meter, netdev ingress"
	}
	return "nft meter, prerouting"
}

func (n nftMeter) setup(e *edge, extraRules int) error {
	if err := e.enableSkbNAPI(); err != nil {
		return err
	}
	family, hook := "ip", "type filter hook prerouting priority -300;"
	match := ""
	if n.netdev {
		family = "netdev"
		hook = fmt.Sprintf("type filter hook ingress devices = { %s, %s } priority -500;", e.floodIf.Name, e.legitIf.Name)
		match = "meta protocol ip "
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s floodbench {\n", family)
	fmt.Fprintf(&b, "  set persrc { type ipv4_addr; size %d; flags dynamic,timeout; timeout 10s; }\n", meterSize)
	fmt.Fprintf(&b, "  chain in {\n    %s\n", hook)
	for i := 0; i < extraRules; i++ {
		// Rules that never match the flood, evaluated before the meter:
		// nftables walks a chain rule by rule.
		fmt.Fprintf(&b, "    %sip saddr 10.%d.%d.%d counter drop\n", match, byte(i>>16), byte(i>>8), byte(i))
	}
	fmt.Fprintf(&b, "    %supdate @persrc { ip saddr limit rate over %d/second burst %d packets } counter drop\n",
		match, perSourceRate, perSourceBurst)
	b.WriteString("  }\n}\n")
	_, err := nsExec(e.ns, b.String(), "nft", "-f", "-")
	return err
}

var counterPackets = regexp.MustCompile(`update @persrc .* counter packets (\d+)`)

func (n nftMeter) dropped(e *edge) (uint64, error) {
	out, err := nsExec(e.ns, "", "nft", "list", "ruleset")
	if err != nil {
		return 0, err
	}
	m := counterPackets.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no meter counter in nft ruleset:\n%s", out)
	}
	return strconv.ParseUint(m[1], 10, 64)
}
func (nftMeter) close() {}

// hashlimit is iptables' per-source hashlimit in the raw table.
type hashlimit struct{}

func (hashlimit) name() string { return "iptables hashlimit" }
func (hashlimit) setup(e *edge, extraRules int) error {
	if err := e.enableSkbNAPI(); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("*raw\n:PREROUTING ACCEPT [0:0]\n")
	for i := 0; i < extraRules; i++ {
		fmt.Fprintf(&b, "-A PREROUTING -s 10.%d.%d.%d/32 -j DROP\n", byte(i>>16), byte(i>>8), byte(i))
	}
	fmt.Fprintf(&b, "-A PREROUTING -m hashlimit --hashlimit-name floodbench --hashlimit-mode srcip "+
		"--hashlimit-above %d/sec --hashlimit-burst %d --hashlimit-htable-size %d --hashlimit-htable-max %d "+
		"--hashlimit-htable-expire 10000 -j DROP\nCOMMIT\n", perSourceRate, perSourceBurst, meterSize, meterSize)
	_, err := nsExec(e.ns, b.String(), "iptables-restore")
	return err
}

func (hashlimit) dropped(e *edge) (uint64, error) {
	out, err := nsExec(e.ns, "", "iptables", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "limit: above") {
			f := strings.Fields(line)
			if len(f) > 0 {
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no hashlimit rule in:\n%s", out)
}
func (hashlimit) close() {}
