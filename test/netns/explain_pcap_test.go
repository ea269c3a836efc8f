package netns_test

import (
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

const explainPcapPolicy = `defaults:
  per_source: {packets: {rate: 20/s, burst: 20}}
sampling: {one_in: 4, max_per_second: 100000}
`

// TestExplainPcap: a flood is captured with `edgectl capture --all`
// against the real daemon, then `edgectl explain --pcap` decides the file
// with the reference model on the live state. The comparison:
//   - every captured frame decided by the deny list (an entry added with
//     `edgectl deny add`, still in force: its state has not changed) gets
//     drop/deny_list again, and there are at least 20 of them;
//   - every frame of the rate-limited sources is charged to rule default
//     and gets pass/ok or drop/source_limit: their buckets have changed
//     since the capture (the whole flood charged them, the file holds a
//     sample), so the verdict is not compared, only printed;
//   - after `edgectl deny remove`, the same deny frames pass (the replay
//     reads the live state, not the comments), and a candidate policy with
//     the entry (--policy, what-if) drops them again as deny_list, while
//     the running data plane still passes them (--frame).
func TestExplainPcap(t *testing.T) {
	s := newScenario(t, 1, attackerNet)
	s.start(explainPcapPolicy)
	s.ctlText("deny", "add", "198.19.8.0/24")
	c := startCapture(t, s, "all", "--all", "-c", "400", "-G", "20")
	a := s.lab.Attackers[0]
	flood := func(src string, seed uint64) {
		f := trafficgen.Flood{
			SrcMAC: a.Link.B.MAC, DstMAC: a.Link.A.MAC, Dst: a.EdgeAddr4, DstPort: testbed.SinkPort,
			Sources: []netip.Prefix{netip.MustParsePrefix(src)}, Distinct: 4, SrcPorts: []uint16{5001},
			Proto: trafficgen.UDP, Payload: 200, Rate: 2000, Count: 1200, Duration: 5 * time.Second, Seed: seed,
		}
		if fr, err := s.lab.Flood(s.ctx, a, f); err != nil || fr.Sent == 0 {
			t.Fatalf("flood from %s: %+v, %v", src, fr, err)
		}
	}
	flood("198.19.8.0/24", 1)
	flood("198.19.7.0/24", 2)
	c.wait(t)

	replay := func(args ...string) control.FrameReplay {
		t.Helper()
		out := s.ctlText(append([]string{"explain", "-o", "json"}, args...)...)
		var r control.FrameReplay
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("explain %v -o json: %v: %s", args, err, out)
		}
		return r
	}
	start := time.Now()
	r := replay("--pcap", c.file)
	t.Logf("explain --pcap: %d frames in %v; totals %+v", len(r.Frames), time.Since(start), r.Totals)
	if len(r.Frames) != 400 || r.Compared != 400 {
		t.Fatalf("%d frames, %d with a captured verdict; want 400 and 400", len(r.Frames), r.Compared)
	}
	deny := netip.MustParsePrefix("198.19.8.0/24")
	var denied []int
	bucketAgree, bucket := 0, 0
	for i, f := range r.Frames {
		if f.Src == nil {
			t.Fatalf("frame %d: no source: %+v", f.N, f)
		}
		switch {
		case f.WasReason == "deny_list":
			denied = append(denied, i)
			if f.Verdict != "drop" || f.Reason != "deny_list" || !deny.Contains(*f.Src) {
				t.Errorf("frame %d from %s captured as drop/deny_list: now %s/%s", f.N, f.Src, f.Verdict, f.Reason)
			}
		case netip.MustParsePrefix("198.19.7.0/24").Contains(*f.Src):
			bucket++
			ok := f.Verdict == "pass" && f.Reason == "ok" || f.Verdict == "drop" && f.Reason == "source_limit"
			if !ok || f.Rule != "default" {
				t.Errorf("frame %d from %s: %s/%s rule %q, want pass/ok or drop/source_limit under default", f.N, f.Src, f.Verdict, f.Reason, f.Rule)
			}
			if f.Verdict == f.WasVerdict && f.Reason == f.WasReason {
				bucketAgree++
			}
		case f.Src.IsLinkLocalUnicast() || f.Src.IsUnspecified():
			// The kernel's own neighbour discovery and MLD on the test's
			// veths (link-local or unspecified sources): sampled too.
			t.Logf("frame %d from %s captured as %s/%s: the host's own (not of the floods), not compared", f.N, f.Src, f.WasVerdict, f.WasReason)
		default:
			t.Errorf("frame %d from %s captured as %s/%s: not of the floods", f.N, f.Src, f.WasVerdict, f.WasReason)
		}
	}
	t.Logf("deny-list frames: %d, all agree; rate-limited frames: %d, %d agree (not required: their buckets changed)",
		len(denied), bucket, bucketAgree)
	if len(denied) < 20 {
		t.Fatalf("%d deny-list frames in the capture, want at least 20", len(denied))
	}
	text := s.ctlText("explain", "--pcap", c.file)
	lines := strings.Split(text, "\n")
	t.Logf("explain --pcap (head and tail):\n%s\n...\n%s", strings.Join(lines[:min(len(lines), 6)], "\n"), strings.Join(lines[max(0, len(lines)-10):], "\n"))
	for _, want := range []string{"private copy", "totals:", "drop  deny_list", "captured verdict get the same verdict"} {
		if !strings.Contains(text, want) {
			t.Errorf("explain --pcap text lacks %q:\n%s", want, text[:min(len(text), 2000)])
		}
	}

	// The deny entry goes: the same frames pass now; a candidate policy
	// that lists it drops them again, and the running state is untouched.
	s.ctlText("deny", "remove", "198.19.8.0/24")
	r = replay("--pcap", c.file)
	for _, i := range denied {
		if f := r.Frames[i]; f.Reason == "deny_list" {
			t.Errorf("frame %d after deny remove: still %s/%s", f.N, f.Verdict, f.Reason)
		}
	}
	cand := filepath.Join(t.TempDir(), "candidate.yaml")
	pol, err := os.ReadFile(s.lab.PolicyPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cand, append(pol, []byte("lists: {deny: [198.19.8.0/24]}\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	r = replay("--pcap", c.file, "--policy", cand)
	if r.Policy != cand {
		t.Errorf("what-if policy %q, want %s", r.Policy, cand)
	}
	for _, i := range denied {
		if f := r.Frames[i]; f.Verdict != "drop" || f.Reason != "deny_list" {
			t.Errorf("frame %d with the candidate policy: %s/%s, want drop/deny_list", f.N, f.Verdict, f.Reason)
		}
	}
	data := readCapture(t, c.file)[denied[0]].data
	if r := replay("--frame", hex.EncodeToString(data)); len(r.Frames) != 1 || r.Frames[0].Reason == "deny_list" {
		t.Errorf("--frame after the what-if: %+v, want the running state (no deny entry)", r.Frames)
	}
}
