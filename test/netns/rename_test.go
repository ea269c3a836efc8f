package netns_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/test/netns"
)

// renameSyn protects a port, so the SYN path (and its tcx links) runs too
// where the kernel has it.
const renameSyn = `syn:
  services:
    - name: api
      listen: ["0.0.0.0:9441"]
      protection: monitor
`

// TestRenamedInterfaceRestart: an interface renamed while no daemon runs
// keeps the links the last run pinned under its old name (the kernel
// attaches by index). A restart whose policy still names the old name
// fails, says where the link is now, and changes nothing; one that names
// the new name takes the link over (the pin moves; XDP and tcx) and
// enforces with the new program. After that start, the links the last run
// pinned that nothing took over are removed and reported: a severed one
// (interface deleted) and one on an interface the policy no longer names;
// a pin in the directory that runs a program not Edgeguard's is left
// alone.
func TestRenamedInterfaceRestart(t *testing.T) {
	s := netns.New(t).Star(1)
	nl := s.Edge.Netlink()
	veth := func(name string) int {
		t.Helper()
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		l, err := nl.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	idx := veth("egsyn-ra")
	veth("egsyn-rc")
	veth("egsyn-rd")
	veth("egsyn-re")
	synSection := ""
	if loader.ProbeSyn() == nil {
		synSection = renameSyn
	}
	h := newDaemonHarness(t, s.Edge)
	h.PinDir = filepath.Join("/sys/fs/bpf", fmt.Sprintf("egsyn-rename-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(h.PinDir) })
	write := func(ifaces ...string) {
		t.Helper()
		var lines []string
		for _, i := range ifaces {
			lines = append(lines, fmt.Sprintf("  - {name: %s, xdp_mode: generic}", i))
		}
		if err := os.WriteFile(h.Config, []byte(xdpHead(100000, lines...)+synSection), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pinned := func(rel string) bool {
		_, err := os.Stat(filepath.Join(h.PinDir, rel))
		return err == nil
	}
	write("egsyn-ra", "egsyn-rc", "egsyn-rd")
	h.start()
	// The program on the interface: the limiter, or the SYN path's
	// entry in front of it.
	prog := attachedProgID(t, s.Edge, "egsyn-ra")
	if prog == 0 || (synSection == "" && prog != h.status().ProgramID) {
		t.Fatalf("egsyn-ra carries %d, want the daemon's program", prog)
	}
	// A pin in the directory that is not ours: an XDP_PASS program of
	// the test's own, pinned under links/ as if for egsyn-re.
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "egsyn_foreign", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	if err := s.Edge.Do(func() error {
		ifc, err := net.InterfaceByName("egsyn-re")
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: foreign, Interface: ifc.Index, Flags: link.XDPGenericMode})
		if err != nil {
			return err
		}
		defer l.Close()
		return l.Pin(filepath.Join(h.PinDir, "links", "egsyn-re"))
	}); err != nil {
		t.Fatalf("foreign pin: %v", err)
	}
	foreignID := attachedProgID(t, s.Edge, "egsyn-re")

	// The daemon dies; its pins keep enforcing. Meanwhile egsyn-ra is
	// renamed and egsyn-rc deleted.
	h.Kill()
	l, err := nl.LinkByName("egsyn-ra")
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { return nl.LinkSetDown(l) },
		func() error { return nl.LinkSetName(l, "egsyn-rb") },
		func() error { return nl.LinkSetUp(l) },
	} {
		if err := step(); err != nil {
			t.Fatalf("rename egsyn-ra: %v", err)
		}
	}
	rc, _ := nl.LinkByName("egsyn-rc")
	if err := nl.LinkDel(rc); err != nil {
		t.Fatal(err)
	}
	if got := attachedProgID(t, s.Edge, "egsyn-rb"); got != prog {
		t.Fatalf("after the rename egsyn-rb carries %d, want the pinned %d", got, prog)
	}

	// The old name: refused with where the link is; nothing changes.
	if err := h.Start(context.Background()); err == nil {
		h.Kill()
		t.Fatal("start with a policy naming the renamed interface's old name succeeded")
	} else if msg := err.Error(); !strings.Contains(msg, "egsyn-ra: no such network interface") ||
		!strings.Contains(msg, "renamed") || !strings.Contains(msg, "on egsyn-rb") {
		t.Errorf("start with the old name: %v", err)
	}
	if got := attachedProgID(t, s.Edge, "egsyn-rb"); got != prog || !pinned("links/egsyn-ra") || !pinned("links/egsyn-rd") {
		t.Fatalf("a failed start changed the links: egsyn-rb carries %d (want %d), pins ra %v rd %v",
			got, prog, pinned("links/egsyn-ra"), pinned("links/egsyn-rd"))
	}

	// The new name: taken over.
	write("egsyn-rb")
	h.start()
	st := h.status()
	if got := attachedProgID(t, s.Edge, "egsyn-rb"); got == 0 || got == prog || (synSection == "" && got != st.ProgramID) {
		t.Errorf("egsyn-rb carries %d, want the new daemon's program (limiter %d; the last run's was %d)", got, st.ProgramID, prog)
	}
	var found bool
	for _, i := range st.Interfaces {
		found = found || (i.Name == "egsyn-rb" && i.Ifindex == idx)
	}
	if !found {
		t.Errorf("status interfaces %+v: want egsyn-rb, ifindex %d", st.Interfaces, idx)
	}
	if !pinned("links/egsyn-rb") || pinned("links/egsyn-ra") {
		t.Errorf("xdp pin not moved: egsyn-rb %v, egsyn-ra %v", pinned("links/egsyn-rb"), pinned("links/egsyn-ra"))
	}
	logs := h.Logs()
	if !strings.Contains(logs, "interface renamed: took over the link pinned under its old name") {
		t.Errorf("no rename take-over in the log:\n%s", logs)
	}
	// Left by the last run and taken over by nothing: removed, reported.
	if pinned("links/egsyn-rc") || pinned("links/egsyn-rd") {
		t.Errorf("stale pins kept: egsyn-rc %v, egsyn-rd %v", pinned("links/egsyn-rc"), pinned("links/egsyn-rd"))
	}
	if got := attachedProgID(t, s.Edge, "egsyn-rd"); got != 0 {
		t.Errorf("egsyn-rd, which the policy no longer names, still carries %d", got)
	}
	if !strings.Contains(logs, "removed the pin of a severed link") || !strings.Contains(logs, "detached a link an earlier run left") {
		t.Errorf("stale links not reported:\n%s", logs)
	}
	// Not ours: left alone.
	if got := attachedProgID(t, s.Edge, "egsyn-re"); got != foreignID || !pinned("links/egsyn-re") ||
		!strings.Contains(logs, "not Edgeguard's") {
		t.Errorf("the foreign pin: egsyn-re carries %d (want %d), pinned %v\n%s", got, foreignID, pinned("links/egsyn-re"), logs)
	}
	if synSection != "" {
		if !pinned("syn/links/tcx-egsyn-rb") || pinned("syn/links/tcx-egsyn-ra") ||
			pinned("syn/links/tcx-egsyn-rc") || pinned("syn/links/tcx-egsyn-rd") {
			t.Errorf("tcx pins: rb %v ra %v rc %v rd %v; want only rb", pinned("syn/links/tcx-egsyn-rb"),
				pinned("syn/links/tcx-egsyn-ra"), pinned("syn/links/tcx-egsyn-rc"), pinned("syn/links/tcx-egsyn-rd"))
		}
		var n int
		if err := s.Edge.Do(func() error {
			r, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return err
			}
			n = len(r.Programs)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%d tcx programs on egsyn-rb, want 1 (the adopted link, not a second one)", n)
		}
	}
	h.stop(syscall.SIGTERM)
	if got := attachedProgID(t, s.Edge, "egsyn-rb"); got != 0 {
		t.Errorf("after stop egsyn-rb carries %d", got)
	}
}
