package capture

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
)

func requireTcpdump(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skip("tcpdump not installed (scripts/install-deps.sh installs it): filters are compiled by tcpdump")
	}
}

func frame(f packet.Frame) []byte {
	if !f.Src.IsValid() {
		f.Src = netip.MustParseAddr("198.18.0.1")
	}
	if !f.Dst.IsValid() {
		f.Dst = netip.MustParseAddr("198.18.0.2")
		if f.Src.Is6() {
			f.Dst = netip.MustParseAddr("fd00::2")
		}
	}
	return f.Build()
}

// TestFilterMatchesAsTcpdump: expressions compiled by tcpdump match the
// frames tcpdump would, IPv4 and IPv6, behind VLAN tags too; a filter that
// reads past the sampled bytes matches nothing.
func TestFilterMatchesAsTcpdump(t *testing.T) {
	requireTcpdump(t)
	dns := frame(packet.Frame{Proto: packet.ProtoUDP, SrcPort: 4000, DstPort: 53, Payload: 20})
	https := frame(packet.Frame{Proto: packet.ProtoTCP, SrcPort: 4000, DstPort: 443, TCPFlags: 0x02})
	dns6 := frame(packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoUDP, SrcPort: 4000, DstPort: 53})
	vlanDNS := frame(packet.Frame{VLANs: []uint16{7}, Proto: packet.ProtoUDP, SrcPort: 4000, DstPort: 53})
	for _, tc := range []struct {
		expr  string
		frame []byte
		want  bool
	}{
		{"udp and dst port 53", dns, true},
		{"udp and dst port 53", https, false},
		{"udp and dst port 53", dns6, true},
		{"udp and dst port 53", vlanDNS, false}, // as tcpdump: a tag needs "vlan and"
		{"vlan 7 and udp dst port 53", vlanDNS, true},
		{"tcp[tcpflags] & tcp-syn != 0", https, true},
		{"tcp[tcpflags] & tcp-syn != 0", dns, false},
		{"src net 198.18.0.0/15", dns, true},
		{"src net 198.18.0.0/15", dns6, false},
		{"ip6 and src fd00::1", dns6, true},
		{"udp[100:4] = 0", dns, false}, // past the frame's bytes
		{"len > 1000", https, false},
	} {
		prog, err := CompileFilter(context.Background(), tc.expr)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		m, err := NewMatcher(prog)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		if got := m.Match(tc.frame); got != tc.want {
			t.Errorf("%q on %d-byte frame: match %v, want %v", tc.expr, len(tc.frame), got, tc.want)
		}
	}
	if _, err := CompileFilter(context.Background(), "udp and"); err == nil || !strings.Contains(err.Error(), "syntax error") {
		t.Errorf("bad expression: %v, want tcpdump's syntax error", err)
	}
	if p, err := CompileFilter(context.Background(), "  "); p != nil || err != nil {
		t.Errorf("empty expression: %v, %v, want no program", p, err)
	}
	var none *Matcher
	if !none.Match(dns) {
		t.Error("no filter: want every frame")
	}
}

// TestNewMatcherRefusesHostilePrograms: programs from the control socket
// are checked before they run, and none panics the daemon.
func TestNewMatcherRefusesHostilePrograms(t *testing.T) {
	ret := [4]uint32{0x06, 0, 0, 0xffff} // ret #65535
	long := make([][4]uint32, control.MaxCaptureProgram+1)
	for i := range long {
		long[i] = ret
	}
	for name, prog := range map[string][][4]uint32{
		"jump past the end":    {{0x15, 5, 0, 53}, ret},      // jeq #53, jt +5
		"ja past the end":      {{0x05, 0, 0, 1 << 20}, ret}, // ja +2^20
		"divide by zero":       {{0x34, 0, 0, 0}, ret},       // div #0
		"no return at end":     {{0x28, 0, 0, 12}},           // ldh [12]
		"unknown opcode":       {{0xff, 0, 0, 0}, ret},       //
		"scratch out of range": {{0x60, 0, 0, 16}, ret},      // ld M[16]
		"too long":             long,
		"op out of range":      {{0x10006, 0, 0, 0}},
		"jt out of range":      {{0x15, 256, 0, 0}, ret},
	} {
		if _, err := NewMatcher(prog); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Loads past the data do not match, whatever their size.
	m, err := NewMatcher([][4]uint32{{0x20, 0, 0, 1 << 30}, ret}) // ld [2^30]
	if err != nil {
		t.Fatal(err)
	}
	if m.Match(make([]byte, 64)) {
		t.Error("load past the data matched")
	}
}

// TestParseDDDBounds: tcpdump's output is parsed strictly.
func TestParseDDDBounds(t *testing.T) {
	for _, s := range []string{"", "x", "0", "1\n6 0 0", "2\n6 0 0 1", "1\n6 0 0 4294967296", "1\n65536 0 0 0",
		"1\n6 256 0 0", "4097\n"} {
		if _, err := parseDDD(s); err == nil {
			t.Errorf("%q: accepted", s)
		}
	}
	p, err := parseDDD("2\n40 0 0 12\n6 0 0 262144\n")
	if err != nil || len(p) != 2 || p[0] != [4]uint32{40, 0, 0, 12} || p[1] != [4]uint32{6, 0, 0, 262144} {
		t.Errorf("parse: %v, %v", p, err)
	}
}

// TestSelection: which samples each capture takes; a dropped packet the
// drop sampler may have sent is never taken from the 1-in-N sampler too.
func TestSelection(t *testing.T) {
	drop := maps.Sample{Kind: maps.SampleDrop, Action: maps.ActDrop, Reason: maps.ReasonSrcLimit}
	would := maps.Sample{Kind: maps.SampleDrop, Action: maps.ActWouldDrop, Reason: maps.ReasonSrcLimit}
	rateDrop := maps.Sample{Kind: maps.SampleRate, Action: maps.ActDrop, Reason: maps.ReasonSrcLimit}
	rateDeny := maps.Sample{Kind: maps.SampleRate, Action: maps.ActDrop, Reason: maps.ReasonDeny}
	ratePass := maps.Sample{Kind: maps.SampleRate, Action: maps.ActPass, Reason: maps.ReasonOK}
	for _, tc := range []struct {
		which   string
		reasons []string
		want    [5]bool // drop, would, rateDrop, rateDeny, ratePass
	}{
		{"", nil, [5]bool{true, true, false, true, false}},
		{"dropped", nil, [5]bool{true, true, false, true, false}},
		{"passed", nil, [5]bool{false, false, false, false, true}},
		{"all", nil, [5]bool{true, true, false, true, true}},
		{"all", []string{"deny_list", "ok"}, [5]bool{false, false, false, true, true}},
		{"dropped", []string{"source_limit"}, [5]bool{true, true, false, false, false}},
	} {
		sel, err := ParseSelection(tc.which, tc.reasons)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range []maps.Sample{drop, would, rateDrop, rateDeny, ratePass} {
			if got := sel.Wants(s); got != tc.want[i] {
				t.Errorf("%q %v, sample %d: %v, want %v", tc.which, tc.reasons, i, got, tc.want[i])
			}
		}
	}
	if _, err := ParseSelection("some", nil); err == nil {
		t.Error("which \"some\": accepted")
	}
	if _, err := ParseSelection("", []string{"source-limit"}); err == nil || !strings.Contains(err.Error(), "source_limit") {
		t.Errorf("unknown reason: %v, want the list of reasons", err)
	}
}

// TestWriterReadBack: a written file reads back with pcapgo: every frame's
// bytes (cut to the snap length), length, time and comment; and tcpdump
// reads it.
func TestWriterReadBack(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, FileInfo{Application: "test", Comment: "a test", Filter: "udp", SnapLen: 100, Interfaces: []string{"eth0"}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 123456789, time.UTC)
	frames := []*control.CaptureFrame{
		{Time: t0, Sampler: "drop", Action: "drop", Reason: "shield_tighten", Rule: "api", Class: "new", Refused: "refused_reserve", RefusedBy: "asn",
			Len: 1400, Data: bytes.Repeat([]byte{0xab}, 128)},
		{Time: t0.Add(time.Millisecond), Sampler: "1-in-N", Weight: 1024, Action: "pass", Reason: "ok", Rule: "api",
			Class: "unknown", Len: 60, Data: bytes.Repeat([]byte{0xcd}, 60)},
	}
	for _, f := range frames {
		if err := w.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	r, err := pcapgo.NewNgReader(bytes.NewReader(data), pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	if intf, err := r.Interface(0); err != nil || intf.SnapLength != 100 || intf.Filter != "udp" {
		t.Errorf("interface %+v, %v", intf, err)
	}
	wantComments := []string{
		"edgeguard verdict=drop reason=shield_tighten rule=api class=new refused=refused_reserve refused_by=asn sampler=drop",
		"edgeguard verdict=pass reason=ok rule=api class=unknown sampler=1-in-N weight=1024",
	}
	for i, f := range frames {
		got, ci, opts, err := r.ZeroCopyReadPacketDataWithOptions()
		if err != nil {
			t.Fatal(err)
		}
		want := f.Data[:min(len(f.Data), 100)]
		if !bytes.Equal(got, want) || ci.Length != f.Len || !ci.Timestamp.Equal(f.Time) {
			t.Errorf("frame %d: %d bytes, length %d, time %v", i, len(got), ci.Length, ci.Timestamp)
		}
		if len(opts.Comments) != 1 || opts.Comments[0] != wantComments[i] {
			t.Errorf("frame %d: comments %q, want %q", i, opts.Comments, wantComments[i])
		}
	}
	if _, _, _, err := r.ZeroCopyReadPacketDataWithOptions(); !errors.Is(err, io.EOF) {
		t.Errorf("after the frames: %v, want EOF", err)
	}

	requireTcpdump(t)
	cmd := exec.Command("tcpdump", "-nr", "-", "-tt")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -r: %v\n%s", err, out)
	}
	lines := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "1796") { // -tt: seconds since the epoch
			lines++
		}
	}
	if lines != len(frames) {
		t.Errorf("tcpdump read %d frames, want %d:\n%s", lines, len(frames), out)
	}

	// Wireshark's reader (tshark) shows each frame's comment.
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Skip("tshark not installed (scripts/install-deps.sh installs it): Wireshark's reading not checked")
	}
	cmd = exec.Command("tshark", "-r", "-", "-T", "fields", "-e", "frame.comment", "-e", "frame.len", "-e", "frame.cap_len")
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("tshark -r: %v\n%s", err, stderr.String())
	}
	want := wantComments[0] + "\t1400\t100\n" + wantComments[1] + "\t60\t60\n"
	if string(out) != want {
		t.Errorf("tshark:\n%s\nwant\n%s", out, want)
	}
}
