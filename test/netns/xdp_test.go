package netns_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/test/netns"
)

// Policy used by every test here: rule 1 limits each client source to
// 10/s with a burst of 20; rule 0 (everything else: the Alt sentinel
// addresses, link-local neighbour discovery) is unlimited, so background
// traffic never touches rule 1's buckets or counters and those are exact.
const (
	limitedRule = 1
	ratePerSec  = 10
	burstSize   = 20
	burstCount  = 200
	udpPort     = 9000
)

var sizes = loader.Sizes{MaxRules: 16, SrcEntries: 4096, AggEntries: 1024, PrefixEntries: 1024, ListEntries: 256, L4Entries: 16}

var pinSeq atomic.Uint64

func xdpPolicy(c *netns.Client) *policy.Compiled {
	return &policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Rules: []policy.CompiledRule{
			{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 128}},
			{
				ID:        limitedRule,
				SourceKey: policy.KeyBits{V4: 32, V6: 128},
				PerSource: policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: ratePerSec, Per: time.Second}, Burst: burstSize}},
			},
		},
		Prefixes: []policy.PrefixFact{
			{Prefix: netip.PrefixFrom(c.Src4, 32), RuleID: limitedRule},
			{Prefix: netip.PrefixFrom(c.Src6, 128), RuleID: limitedRule},
		},
	}
}

// startFrozen makes xdpPolicy(c) m's live generation with the test clock
// frozen at one hour and attaches d to c's edge link in native mode.
func startFrozen(t *testing.T, ns *netns.Namespace, c *netns.Client, d *loader.Datapath, m *maps.Maps) *loader.Attachment {
	t.Helper()
	if err := m.SetTestClock(uint64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := mapstest.StageCommit(m, xdpPolicy(c)); err != nil {
		t.Fatal(err)
	}
	return mustAttach(t, ns, d, c.EdgeIf)
}

// attach attaches d to iface from inside ns: interface names and indexes
// are per namespace.
func attach(t *testing.T, ns *netns.Namespace, d *loader.Datapath, iface string) (*loader.Attachment, error) {
	t.Helper()
	var a *loader.Attachment
	err := ns.Do(func() (err error) {
		a, err = d.Attach(iface, loader.ModeNative)
		return err
	})
	return a, err
}

func mustAttach(t *testing.T, ns *netns.Namespace, d *loader.Datapath, iface string) *loader.Attachment {
	t.Helper()
	a, err := attach(t, ns, d, iface)
	if err != nil {
		t.Fatalf("attach in native mode: %v", err)
	}
	if a.Mode != loader.ModeNative {
		t.Fatalf("attached in %s mode, want native", a.Mode)
	}
	// What the kernel says, not only what the loader asked for.
	l, err := ns.Netlink().LinkByName(iface)
	if err != nil {
		t.Fatalf("find %s: %v", iface, err)
	}
	if x := l.Attrs().Xdp; x == nil || x.AttachMode != xdpAttachedDrv {
		t.Fatalf("kernel reports xdp on %s as %+v, want attach mode %d (driver)", iface, x, xdpAttachedDrv)
	}
	return a
}

// xdpAttachedDrv is XDP_ATTACHED_DRV from linux/if_link.h.
const xdpAttachedDrv = 1

// attachedProgID is the id of the XDP program on iface, or 0.
func attachedProgID(t *testing.T, ns *netns.Namespace, iface string) uint32 {
	t.Helper()
	l, err := ns.Netlink().LinkByName(iface)
	if err != nil {
		t.Fatalf("find %s: %v", iface, err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return x.ProgId
	}
	return 0
}

func progID(t *testing.T, p *ebpf.Program) uint32 {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return uint32(id)
}

// flows are the sockets of one address family: the limited source, the
// unlimited sentinel source and the edge's receiving socket.
type flows struct {
	name           string
	from, sentinel *net.UDPConn
	to             *net.UDPConn
}

func openFlows(t *testing.T, s *netns.Star) []flows {
	t.Helper()
	c := s.Clients[0]
	var out []flows
	for _, f := range []struct {
		name           string
		edge, src, alt netip.Addr
	}{
		{"ipv4", c.EdgeAddr4, c.Src4, c.Alt4},
		{"ipv6", c.EdgeAddr6, c.Src6, c.Alt6},
	} {
		dst := netip.AddrPortFrom(f.edge, udpPort)
		to, err := s.Edge.ListenUDP(dst)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { to.Close() })
		from, err := c.NS.DialUDP(netip.AddrPortFrom(f.src, 0), dst)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { from.Close() })
		sentinel, err := c.NS.DialUDP(netip.AddrPortFrom(f.alt, 0), dst)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sentinel.Close() })
		out = append(out, flows{name: f.name, from: from, sentinel: sentinel, to: to})
	}
	return out
}

func burst(t *testing.T, f flows, n int) int {
	t.Helper()
	got, err := netns.UDPBurst{From: f.from, Sentinel: f.sentinel, To: f.to, Count: n, Payload: 32}.Run()
	if err != nil {
		t.Fatalf("%s burst: %v", f.name, err)
	}
	return got
}

func ruleCounters(t *testing.T, m *maps.Maps) maps.RuleCounters {
	t.Helper()
	rc, err := m.Counters.Rules([]uint32{limitedRule})
	if err != nil {
		t.Fatal(err)
	}
	return rc[limitedRule]
}

func counters(t *testing.T, m *maps.Maps) maps.Counters {
	t.Helper()
	c, err := m.Counters.Totals()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkCounters checks the program's own accounting against what the
// sockets saw: every datagram of rule 1 reached the program, the passed
// ones are exactly the received ones, and only rule 1 drops anything.
func checkCounters(t *testing.T, m *maps.Maps, sent, received int) {
	t.Helper()
	rc := ruleCounters(t, m)
	pass, drop := rc[maps.ActPass].Packets, rc[maps.ActDrop].Packets
	if pass != uint64(received) || drop != uint64(sent-received) {
		t.Errorf("rule %d counters: pass %d drop %d; sockets: %d sent, %d received (want pass %d drop %d)",
			limitedRule, pass, drop, sent, received, received, sent-received)
	}
	c := counters(t, m)
	if got := c.Get(maps.ActDrop, maps.ReasonSrcLimit).Packets; got != drop {
		t.Errorf("drop/source_limit counter = %d, want %d (rule %d's drops)", got, drop, limitedRule)
	}
	if got := c.Total(maps.ActDrop).Packets; got != drop {
		t.Errorf("drops for any reason = %d, want %d", got, drop)
	}
	if got := c.Get(maps.ActPass, maps.ReasonOK).Packets; got < pass {
		t.Errorf("pass/ok counter = %d, below rule %d's %d passes", got, limitedRule, pass)
	}
}

// TestNativeBurstFrozenClock: with time frozen, a burst of 200 from one
// source passes exactly the burst size of 20, for IPv4 and IPv6, and the
// counters agree with the sockets.
func TestNativeBurstFrozenClock(t *testing.T) {
	s := netns.New(t).Star(1)
	c := s.Clients[0]
	d, m := mapstest.Load(t, loader.Options{Sizes: sizes, TestClock: true})
	a := startFrozen(t, s.Edge, c, d, m)
	t.Cleanup(func() { a.Detach() })

	sent, received := 0, 0
	for _, f := range openFlows(t, s) {
		got := burst(t, f, burstCount)
		if got != burstSize {
			t.Errorf("%s: received %d of %d at one instant, want exactly the burst %d", f.name, got, burstCount, burstSize)
		}
		sent += burstCount
		received += got
	}
	checkCounters(t, m, sent, received)
}

// TestNativeBurstRealClock runs the same burst on the kernel clock, as in
// production. The burst takes some milliseconds, during which tokens refill
// at 10/s: the passed count is at least the burst and at most the burst
// plus the refill over the measured time.
func TestNativeBurstRealClock(t *testing.T) {
	s := netns.New(t).Star(1)
	c := s.Clients[0]
	d, m := mapstest.Load(t, loader.Options{Sizes: sizes})
	if err := mapstest.StageCommit(m, xdpPolicy(c)); err != nil {
		t.Fatal(err)
	}
	a := mustAttach(t, s.Edge, d, c.EdgeIf)
	t.Cleanup(func() { a.Detach() })

	sent, received := 0, 0
	for _, f := range openFlows(t, s) {
		start := time.Now()
		got := burst(t, f, burstCount)
		elapsed := time.Since(start)
		// GCRA admits burst + floor(span / interval) over any span; the
		// span between the first and last packet is inside elapsed.
		upper := burstSize + int(elapsed*ratePerSec/time.Second)
		t.Logf("%s: received %d of %d in %v (bounds %d to %d)", f.name, got, burstCount, elapsed, burstSize, upper)
		if got < burstSize || got > upper {
			t.Errorf("%s: received %d of %d in %v, want %d to %d", f.name, got, burstCount, elapsed, burstSize, upper)
		}
		sent += burstCount
		received += got
	}
	checkCounters(t, m, sent, received)
}

// TestAttachRefusesOtherProgram: Attach never replaces an XDP program that
// is not its own link, whether another Edgeguard datapath's or a foreign
// one, and says so with ErrOtherProgram.
func TestAttachRefusesOtherProgram(t *testing.T) {
	s := netns.New(t).Star(2)
	ours, foreignIf := s.Clients[0].EdgeIf, s.Clients[1].EdgeIf

	d1, _ := mapstest.Load(t, loader.Options{Sizes: sizes, TestClock: true})
	a := mustAttach(t, s.Edge, d1, ours)
	t.Cleanup(func() { a.Detach() })

	d2, _ := mapstest.Load(t, loader.Options{Sizes: sizes, TestClock: true})
	if _, err := attach(t, s.Edge, d2, ours); !errors.Is(err, loader.ErrOtherProgram) {
		t.Fatalf("second datapath attached to %s: err = %v, want ErrOtherProgram", ours, err)
	} else if !strings.Contains(err.Error(), ours) || !strings.Contains(err.Error(), "detach it first") {
		t.Errorf("error does not name the interface and the way out: %v", err)
	}
	if got, want := attachedProgID(t, s.Edge, ours), progID(t, d1.Objects.XdpLimiter); got != want {
		t.Errorf("program on %s is id %d after the refused attach, want the first datapath's %d", ours, got, want)
	}

	// A foreign program: a bare XDP_DROP attached by someone else.
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "not_edgeguard", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { foreign.Close() })
	err = s.Edge.Do(func() error {
		ifc, err := net.InterfaceByName(foreignIf)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: foreign, Interface: ifc.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("attach foreign program: %v", err)
	}
	if _, err := attach(t, s.Edge, d2, foreignIf); !errors.Is(err, loader.ErrOtherProgram) {
		t.Fatalf("attach over a foreign program on %s: err = %v, want ErrOtherProgram", foreignIf, err)
	} else if !strings.Contains(err.Error(), "not_edgeguard") {
		t.Errorf("error does not name the foreign program: %v", err)
	}
	if got, want := attachedProgID(t, s.Edge, foreignIf), progID(t, foreign); got != want {
		t.Errorf("program on %s is id %d after the refused attach, want the foreign %d", foreignIf, got, want)
	}
}

// TestPinnedReopenContinuesEnforcing: a daemon that exits without detaching
// leaves its pinned link enforcing; the next one re-opens the pinned maps,
// takes the link over, and continues with the same bucket state and
// counters.
func TestPinnedReopenContinuesEnforcing(t *testing.T) {
	s := netns.New(t).Star(1)
	c := s.Clients[0]
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("eg-test-%d-%d", os.Getpid(), pinSeq.Add(1)))
	t.Cleanup(func() {
		if err := loader.Unpin(pinDir); err != nil {
			t.Error(err)
		}
	})
	v4 := openFlows(t, s)[0]

	// First daemon: apply, attach, exhaust the burst.
	d1, err := loader.Load(loader.Options{Sizes: sizes, TestClock: true, PinDir: pinDir})
	if err != nil {
		t.Fatalf("load with pins: %v", err)
	}
	m1 := maps.New(d1)
	a1 := startFrozen(t, s.Edge, c, d1, m1)
	info, err := a1.Link.Info()
	if err != nil {
		t.Fatal(err)
	}
	linkID := info.ID
	if got := burst(t, v4, burstCount); got != burstSize {
		t.Fatalf("first daemon: received %d, want %d", got, burstSize)
	}

	// It exits without detaching: the pinned link keeps enforcing with no
	// file descriptor open (the old program's frozen clock still reads 1h).
	if err := a1.Release(); err != nil {
		t.Fatal(err)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := burst(t, v4, 50); got != 0 {
		t.Fatalf("between daemons: received %d of 50, want 0 (bucket empty, link still enforcing)", got)
	}

	// Second daemon: same pins. Maps, policy and counters are the old ones.
	d2, m2 := mapstest.Load(t, loader.Options{Sizes: sizes, TestClock: true, PinDir: pinDir})
	rc := ruleCounters(t, m2)
	if rc[maps.ActPass].Packets != burstSize || rc[maps.ActDrop].Packets != burstCount-burstSize+50 {
		t.Fatalf("re-opened counters: pass %d drop %d, want %d and %d (kept from the first daemon)",
			rc[maps.ActPass].Packets, rc[maps.ActDrop].Packets, burstSize, burstCount-burstSize+50)
	}
	// The test clock map is not pinned: the new program's starts at 0.
	// One second after the first daemon's instant, 10 tokens came back.
	if err := m2.SetTestClock(uint64(time.Hour + time.Second)); err != nil {
		t.Fatal(err)
	}
	a2, err := attach(t, s.Edge, d2, c.EdgeIf)
	if err != nil {
		t.Fatalf("take over pinned link: %v", err)
	}
	t.Cleanup(func() { a2.Detach() })
	if a2.Mode != loader.ModeNative {
		t.Errorf("taken-over link reports %s mode, want native", a2.Mode)
	}
	if info, err := a2.Link.Info(); err != nil {
		t.Fatal(err)
	} else if info.ID != linkID {
		t.Errorf("link id %d after take-over, want the pinned link %d", info.ID, linkID)
	}
	if got, want := attachedProgID(t, s.Edge, c.EdgeIf), progID(t, d2.Objects.XdpLimiter); got != want {
		t.Errorf("program on %s is id %d, want the second daemon's %d", c.EdgeIf, got, want)
	}
	// A fresh bucket would pass 20; the continued one passes exactly the
	// 10 refilled in one second at 10/s.
	if got := burst(t, v4, 50); got != ratePerSec {
		t.Fatalf("second daemon: received %d of 50, want exactly %d (bucket state continued)", got, ratePerSec)
	}
	checkCounters(t, m2, burstCount+50+50, burstSize+ratePerSec)
}
