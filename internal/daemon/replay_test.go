package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/capture"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/packet"
)

const replayPolicy = `apiVersion: edgeguard/v1
mode: enforce
tables:
  per_source_entries: 4096
  aggregate_entries: 4096
  prefix_entries: 4096
  list_entries: 1024
  max_rules: 16
lists:
  deny: [198.18.9.0/24]
defaults:
  per_source: {packets: {rate: 1/min, burst: 3}}
rules:
  - name: dns
    match: {protocol: udp, dst_ports: [53]}
    per_source: {packets: {rate: 1/min, burst: 1}}
metrics: {listen: ""}
`

func replayFrame4(src string, proto uint8, dport uint16, payload int) []byte {
	return packet.Frame{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("198.18.0.2"), Proto: proto,
		SrcPort: 40000, DstPort: dport, Payload: payload}.Build()
}

func verdicts(r control.FrameReplay) string {
	var s []string
	for _, f := range r.Frames {
		s = append(s, f.Verdict+"/"+f.Reason)
	}
	return strings.Join(s, " ")
}

// TestExplainFrames: frames are decided in order on a private copy (the
// fourth frame of a source with a burst of 3 is dropped, the deny list
// drops, an L4 rule's burst of 1 holds), the real maps are not charged
// (a second request gets the same answers), a frame whose headers the
// capture cut is undecided, one cut in its payload is decided at its
// length, and a candidate policy decides instead of the running one.
func TestExplainFrames(t *testing.T) {
	d := loadedDaemon(t, Options{StateDir: t.TempDir()}, replayPolicy)
	a := replayFrame4("198.18.1.1", packet.ProtoTCP, 443, 20)
	dns := replayFrame4("198.18.1.2", packet.ProtoUDP, 53, 100)
	denied := replayFrame4("198.18.9.9", packet.ProtoUDP, 53, 10)
	frames := []control.CaptureFrame{{Data: a}, {Data: a}, {Data: a}, {Data: a}, {Data: dns[:60], Len: len(dns)},
		{Data: dns[:30], Len: len(dns)}, {Data: dns}, {Data: denied}}
	pcap := captureFile(t, frames)
	want := "pass/ok pass/ok pass/ok drop/source_limit pass/ok undecided/snap_length drop/source_limit drop/deny_list"
	for run := range 2 {
		r, err := d.ExplainFrames(context.Background(), control.ExplainFramesRequest{Pcap: pcap})
		if err != nil {
			t.Fatal(err)
		}
		if got := verdicts(r); got != want {
			t.Fatalf("run %d: verdicts %s\nwant %s", run, got, want)
		}
		if f := r.Frames[4]; f.Rule != "dns" || f.Len != len(dns) || f.Captured != 60 || f.DPort != 53 || f.Proto != "udp" {
			t.Errorf("frame 5: %+v", f)
		}
		if f := r.Frames[0]; f.Src == nil || f.Src.String() != "198.18.1.1" || f.Rule != "default" {
			t.Errorf("frame 1: %+v", f)
		}
		if len(r.Totals) == 0 || r.Totals[0] != (control.VerdictTotal{Verdict: "pass", Reason: "ok", Frames: 4}) {
			t.Errorf("totals %+v", r.Totals)
		}
		if r.Policy != "running" || r.Compared != 8 || r.Agreed != 0 {
			t.Errorf("policy %q, compared %d agreed %d", r.Policy, r.Compared, r.Agreed)
		}
	}
	one, err := d.ExplainFrames(context.Background(), control.ExplainFramesRequest{Frame: denied})
	if err != nil || verdicts(one) != "drop/deny_list" {
		t.Errorf("--frame: %s, %v", verdicts(one), err)
	}
	cand := strings.Replace(replayPolicy, "deny: [198.18.9.0/24]", "deny: []", 1)
	r, err := d.ExplainFrames(context.Background(), control.ExplainFramesRequest{Frame: denied, Policy: cand, PolicySource: "next.yaml"})
	if err != nil || verdicts(r) != "pass/ok" || r.Policy != "next.yaml" || r.Frames[0].Rule != "dns" {
		t.Errorf("what-if without the deny entry: %s rule %q policy %q, %v", verdicts(r), r.Frames[0].Rule, r.Policy, err)
	}
	_, err = d.ExplainFrames(context.Background(), control.ExplainFramesRequest{Frame: denied, Policy: "rules: [{name: x, bogus: 1}]"})
	if err == nil {
		t.Error("an invalid candidate policy was used")
	}
	if r, err := d.ExplainFrames(context.Background(), control.ExplainFramesRequest{Frame: denied}); err != nil || verdicts(r) != "drop/deny_list" {
		t.Errorf("the what-if changed the running state: %s, %v", verdicts(r), err)
	}
}

// captureFile is a pcapng file of frames, as edgectl capture writes them.
func captureFile(t *testing.T, frames []control.CaptureFrame) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := capture.NewWriter(&b, capture.FileInfo{Application: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		f := &frames[i]
		if f.Len == 0 {
			f.Len = len(f.Data)
		}
		f.Action, f.Reason, f.Class, f.Sampler = "drop", "test", "unknown", "drop"
		if err := w.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	return b.Bytes()
}

// TestExplainFramesRequestBounds: requests are refused before any state is
// read when they hold nothing, both a file and a frame, a file over the
// bound, a frame over the longest one, or a file that is not a capture.
func TestExplainFramesRequestBounds(t *testing.T) {
	for _, tc := range []struct {
		req  control.ExplainFramesRequest
		want string
	}{
		{control.ExplainFramesRequest{}, "no frames"},
		{control.ExplainFramesRequest{Pcap: []byte("x"), Frame: []byte("y")}, "not both"},
		{control.ExplainFramesRequest{Pcap: make([]byte, control.MaxReplayFile+1)}, fmt.Sprintf("at most %d", control.MaxReplayFile)},
		{control.ExplainFramesRequest{Frame: make([]byte, 70000)}, "at most 65557"},
		{control.ExplainFramesRequest{Pcap: []byte("not a capture file")}, "not a pcap or pcapng file"},
	} {
		_, err := replayFrames(tc.req)
		if err == nil || !errors.Is(err, errReplayInput) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d/%d bytes: %v, want %q", len(tc.req.Pcap), len(tc.req.Frame), err, tc.want)
		}
	}
}

// TestExplainFramesControlHostile: at the control socket, a body over the
// bound is refused (413) whether it declares its length or streams, and a
// file that is not an Ethernet capture is refused (422) saying why,
// before any state is read (this daemon has no data plane).
func TestExplainFramesControlHostile(t *testing.T) {
	d := newDaemon(Options{})
	mux := http.NewServeMux()
	d.replayRoutes(mux)
	sll := append([]byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0}, make([]byte, 16)...)
	sll[16], sll[20] = 128, 113 // snaplen 128, link type Linux SLL
	body := func(req control.ExplainFramesRequest) io.Reader {
		b, _ := json.Marshal(req)
		return bytes.NewReader(b)
	}
	// A base64 string that does not end.
	endless := io.MultiReader(strings.NewReader(`{"pcap":"`), io.LimitReader(letterA{}, 2*maxFramesBody))
	for _, tc := range []struct {
		name   string
		body   io.Reader
		length int64
		status int
		want   string
	}{
		{"declared too long", strings.NewReader("{}"), maxFramesBody + 1, http.StatusRequestEntityTooLarge, "at most"},
		{"streamed too long", endless, -1, http.StatusRequestEntityTooLarge, "more than"},
		{"not json", strings.NewReader("pcap"), 4, http.StatusBadRequest, "decode"},
		{"linux sll", body(control.ExplainFramesRequest{Pcap: sll}), -2, http.StatusUnprocessableEntity, "only Ethernet"},
		{"empty", body(control.ExplainFramesRequest{}), -2, http.StatusUnprocessableEntity, "no frames"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/explain/frames", tc.body)
		if tc.length != -2 {
			r.ContentLength = tc.length
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, rec.Code, rec.Body.String(), tc.status, tc.want)
		}
	}
}

type letterA struct{}

func (letterA) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'A'
	}
	return len(p), nil
}

// BenchmarkExplainFrames: one request of 10,000 frames from 1,000 sources
// (each new to the model's copy, so each source's tables are looked up in
// the kernel's maps once), per frame; the peer is `explain ADDR` (one
// probe: a read of the state and one decision) in the same run:
// replay per frame / explain per probe is the ratio to report.
func BenchmarkExplainFrames(b *testing.B) {
	d := loadedDaemon(b, Options{StateDir: b.TempDir()}, replayPolicy)
	var frames []control.CaptureFrame
	for i := range 10_000 {
		src := netip.AddrFrom4([4]byte{198, 18, byte(10 + i%1000/250), byte(i % 250)})
		frames = append(frames, control.CaptureFrame{Data: replayFrame4(src.String(), packet.ProtoUDP, 9000, 200)})
	}
	var buf bytes.Buffer
	w, _ := capture.NewWriter(&buf, capture.FileInfo{})
	for i := range frames {
		f := &frames[i]
		f.Len, f.Time = len(f.Data), time.Unix(0, int64(i)*1000)
		w.Write(f)
	}
	w.Flush()
	b.Run("replay-per-frame", func(b *testing.B) {
		for range b.N {
			if _, err := d.ExplainFrames(context.Background(), control.ExplainFramesRequest{Pcap: buf.Bytes()}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(frames)), "ns/frame")
	})
	b.Run("explain-addr", func(b *testing.B) {
		for range b.N {
			if _, err := d.Explain(Probe{Addr: netip.MustParseAddr("198.18.10.1"), Proto: 17, DPort: 9000, Len: 242, TTL: 64}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
