package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/control"
)

// TestPrintFrameReplay: one line per frame (a cut frame says so, a frame
// with a captured verdict shows it), the totals, and the agreement line.
func TestPrintFrameReplay(t *testing.T) {
	src := netip.MustParseAddr("198.19.8.1")
	r := control.FrameReplay{Generation: 3, Policy: "running", Clock: "the data plane's clock now",
		Frames: []control.FrameVerdict{
			{N: 1, Src: &src, Proto: "udp", SPort: 5001, DPort: 9, Len: 242, Captured: 128, Verdict: "drop", Reason: "deny_list", WasVerdict: "drop", WasReason: "deny_list"},
			{N: 2, Offset: 0.0005, Len: 60, Captured: 30, Verdict: "undecided", Reason: "snap_length"},
		},
		Totals:   []control.VerdictTotal{{Verdict: "drop", Reason: "deny_list", Frames: 1}, {Verdict: "undecided", Reason: "snap_length", Frames: 1}},
		Compared: 1, Agreed: 1}
	var b bytes.Buffer
	printFrameReplay(&b, r)
	out := b.String()
	for _, want := range []string{"2 frame(s) decided by the reference model with the running policy (generation 3)",
		"private copy", "198.19.8.1", "5001>9", "242 (128 captured)", "drop (deny_list)", "undecided  snap_length",
		"totals:", "1 of 1 frame(s) with a captured verdict"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestFramesRequest: --frame takes hex with separators, --pcap and
// --frame exclude each other, and a file over the bound is refused before
// it is sent.
func TestFramesRequest(t *testing.T) {
	req, err := framesRequest("", "0x00 11:22\nff", "")
	if err != nil || !bytes.Equal(req.Frame, []byte{0, 0x11, 0x22, 0xff}) {
		t.Errorf("hex frame: %x, %v", req.Frame, err)
	}
	if _, err := framesRequest("", "zz", ""); err == nil {
		t.Error("bad hex accepted")
	}
	if _, err := framesRequest("a.pcap", "00", ""); err == nil {
		t.Error("--pcap and --frame accepted together")
	}
	big := filepath.Join(t.TempDir(), "big.pcap")
	if err := os.WriteFile(big, make([]byte, control.MaxReplayFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := framesRequest(big, "", ""); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a file over the bound: %v", err)
	}
}
