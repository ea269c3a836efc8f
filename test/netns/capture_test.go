package netns_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

const capturePolicy = `defaults:
  per_source: {packets: {rate: 20/s, burst: 20}}
sampling: {one_in: 4, max_per_second: 100000}
`

// captureRun is one `edgectl capture` process.
type captureRun struct {
	name string
	file string
	cmd  *exec.Cmd
	errb bytes.Buffer
	done chan error
}

// startCapture starts `edgectl capture ARGS -w FILE` against the lab's
// daemon and waits until it says it is capturing.
func startCapture(t *testing.T, s *scenario, name string, args ...string) *captureRun {
	t.Helper()
	bin, err := edgectl()
	if err != nil {
		t.Fatal(err)
	}
	c := &captureRun{name: name, file: filepath.Join(t.TempDir(), name+".pcapng"), done: make(chan error, 1)}
	args = append([]string{"capture", "--socket", s.lab.Daemon.Socket, "-w", c.file}, args...)
	c.cmd = exec.CommandContext(s.ctx, bin, args...)
	pr, pw := io.Pipe()
	c.cmd.Stderr = io.MultiWriter(&c.errb, pw)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait(); pw.Close() }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.done
	})
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		ok := false
		for sc.Scan() {
			if !ok && strings.Contains(sc.Text(), "edgectl: capturing") {
				ok = true
				started <- true
			}
		}
		if !ok {
			started <- false
		}
	}()
	select {
	case ok := <-started:
		if !ok {
			t.Fatalf("capture %s did not start: %s", name, c.errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("capture %s: not capturing after 20 s: %s", name, c.errb.String())
	}
	return c
}

// wait waits for the capture to end by itself.
func (c *captureRun) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			t.Fatalf("capture %s: %v: %s", c.name, err, c.errb.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("capture %s: still running after 40 s: %s", c.name, c.errb.String())
	}
}

type capturedPacket struct {
	data    []byte
	length  int
	comment string
}

// readCapture reads a pcapng file back with gopacket's reader.
func readCapture(t *testing.T, file string) []capturedPacket {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []capturedPacket
	for {
		data, ci, opts, err := r.ZeroCopyReadPacketDataWithOptions()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		p := capturedPacket{data: append([]byte(nil), data...), length: ci.Length}
		if len(opts.Comments) == 1 {
			p.comment = opts.Comments[0]
		}
		out = append(out, p)
	}
}

// tcpdumpCount runs tcpdump -r on a file, with a filter, and counts the
// packets it prints.
func tcpdumpCount(t *testing.T, file string, filter ...string) int {
	t.Helper()
	out, err := exec.Command("tcpdump", append([]string{"-nn", "-r", file}, filter...)...).Output()
	if err != nil {
		t.Fatalf("tcpdump -r %s %v: %v", file, filter, err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, " IP ") {
			n++
		}
	}
	return n
}

// TestCapture: `edgectl capture` against the real daemon and a flood from
// a namespace: three captures at once (drops, passes, drops filtered by a
// tcpdump expression) stop at their counts; every frame in their files
// equals the flood generator's frame over the snap length (and has its
// length), its comment carries the verdict, the filter kept only what it
// names, and tcpdump -r reads each file (its filter agreeing with ours).
func TestCapture(t *testing.T) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skip("tcpdump not installed (scripts/install-deps.sh installs it)")
	}
	s := newScenario(t, 1, attackerNet)
	s.start(capturePolicy)
	start := time.Now()

	drops := startCapture(t, s, "drops", "-c", "60", "-G", "30")
	// The passed capture names the flood's sources: the kernel's own
	// frames on the link (an IPv6 MLD report, neighbour discovery) pass
	// too, whenever the kernel sends them, and are not the generator's.
	passed := startCapture(t, s, "passed", "--passed", "-c", "10", "-G", "30", "udp", "and", "src", "net", "198.19.7.0/24")
	port := startCapture(t, s, "port", "-c", "30", "-G", "30", "udp", "and", "src", "port", "5001")
	// Unbounded: one ended by Ctrl-C, one by the daemon stopping.
	interrupted := startCapture(t, s, "interrupted")
	orphan := startCapture(t, s, "orphan", "--all")

	a := s.lab.Attackers[0]
	flood := trafficgen.Flood{
		SrcMAC: a.Link.B.MAC, DstMAC: a.Link.A.MAC, Dst: a.EdgeAddr4, DstPort: testbed.SinkPort,
		Sources: []netip.Prefix{netip.MustParsePrefix("198.19.7.0/24")}, Distinct: 4, SrcPorts: []uint16{5001, 5002},
		Proto: trafficgen.UDP, Payload: 200, Rate: 2000, Count: 3000, Duration: 5 * time.Second, Seed: 27,
	}
	want := map[string]int{} // the first SnapLen bytes of each frame the generator sends: its length
	next := flood.Sequence()
	for n := range uint64(flood.Count) {
		b := next(n)
		want[string(b[:min(len(b), maps.SnapLen)])] = len(b)
	}
	fr, err := s.lab.Flood(s.ctx, a, flood)
	if err != nil || fr.Sent == 0 {
		t.Fatalf("flood: %+v, %v", fr, err)
	}
	for _, c := range []*captureRun{drops, passed, port} {
		c.wait(t)
	}
	interrupted.cmd.Process.Signal(os.Interrupt)
	interrupted.wait(t)
	if n := tcpdumpCount(t, interrupted.file); n == 0 || !strings.Contains(interrupted.errb.String(), fmt.Sprintf("%d frames written", n)) {
		t.Errorf("interrupted capture: tcpdump reads %d frames; it said %q", n, interrupted.errb.String())
	}

	check := func(c *captureRun, n int, verdict string) []capturedPacket {
		t.Helper()
		pkts := readCapture(t, c.file)
		if len(pkts) != n {
			t.Fatalf("%s: %d frames, want %d (-c)", c.name, len(pkts), n)
		}
		for i, p := range pkts {
			if len(p.data) != maps.SnapLen {
				t.Errorf("%s frame %d: %d bytes, want the snap length %d (the frames are %d bytes)", c.name, i, len(p.data), maps.SnapLen, 14+20+8+200)
			}
			if l, ok := want[string(p.data)]; !ok || l != p.length {
				t.Errorf("%s frame %d (length %d): not one of the generator's frames over the snap length:\n%x", c.name, i, p.length, p.data)
			}
			if !strings.HasPrefix(p.comment, "edgeguard verdict="+verdict+" ") || !strings.Contains(p.comment, " class=") {
				t.Errorf("%s frame %d: comment %q, want verdict %s", c.name, i, p.comment, verdict)
			}
		}
		if got := tcpdumpCount(t, c.file); got != n {
			t.Errorf("tcpdump -r %s: %d frames, want %d", c.name, got, n)
		}
		return pkts
	}
	for _, p := range check(drops, 60, "drop") {
		if !strings.Contains(p.comment, "reason=source_limit rule=default class=") || !strings.HasSuffix(p.comment, "sampler=drop") {
			t.Errorf("drops: comment %q, want source_limit by rule default from the drop sampler", p.comment)
		}
	}
	for _, p := range check(passed, 10, "pass") {
		if !strings.Contains(p.comment, "reason=ok rule=default class=unknown") || !strings.Contains(p.comment, "sampler=1-in-N weight=") {
			t.Errorf("passed: comment %q, want ok by rule default from the 1-in-N sampler", p.comment)
		}
	}
	for i, p := range check(port, 30, "drop") {
		if sport := binary.BigEndian.Uint16(p.data[14+20:]); sport != 5001 {
			t.Errorf("port frame %d: source port %d, want only 5001 (the filter)", i, sport)
		}
	}
	// Wireshark's reader shows the same comments.
	if _, err := exec.LookPath("tshark"); err == nil {
		out, err := exec.Command("tshark", "-r", drops.file, "-T", "fields", "-e", "frame.comment").Output()
		if err != nil {
			t.Fatalf("tshark -r: %v", err)
		}
		var comments []string
		for _, p := range readCapture(t, drops.file) {
			comments = append(comments, p.comment)
		}
		if got := strings.TrimSpace(string(out)); got != strings.Join(comments, "\n") {
			t.Errorf("tshark's comments:\n%s\nwant\n%s", got, strings.Join(comments, "\n"))
		}
	} else {
		t.Log("tshark not installed (scripts/install-deps.sh installs it): Wireshark's reading not checked")
	}
	// tcpdump's filter agrees with the daemon's on the unfiltered file.
	var ours int
	for _, p := range readCapture(t, drops.file) {
		if binary.BigEndian.Uint16(p.data[14+20:]) == 5001 {
			ours++
		}
	}
	if got := tcpdumpCount(t, drops.file, "udp", "and", "src", "port", "5001"); got != ours {
		t.Errorf("tcpdump finds %d frames from port 5001 in the drops file, our reading %d", got, ours)
	}
	// Refused before anything streams: a filter tcpdump cannot compile, a
	// reason the data plane does not have.
	if out, err := s.lab.Daemon.Ctl(s.ctx, "capture", "-w", filepath.Join(t.TempDir(), "x"), "udp", "and"); err == nil ||
		!strings.Contains(string(out), "syntax error") {
		t.Errorf("capture with a bad filter: %v: %s", err, out)
	}
	if out, err := s.lab.Daemon.Ctl(s.ctx, "capture", "-w", filepath.Join(t.TempDir(), "x"), "--reason", "nope"); err == nil ||
		!strings.Contains(string(out), "source_limit") {
		t.Errorf("capture with an unknown reason: %v: %s", err, out)
	}
	// The daemon stops: the open capture ends with an error, its file
	// whole.
	if err := s.lab.Daemon.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-orphan.done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(orphan.errb.String(), "the daemon ended the capture") {
			t.Errorf("capture when the daemon stopped: %v: %s", err, orphan.errb.String())
		}
		orphan.done <- err
	case <-time.After(20 * time.Second):
		t.Fatalf("capture still running 20 s after the daemon stopped: %s", orphan.errb.String())
	}
	if n := tcpdumpCount(t, orphan.file); n == 0 {
		t.Errorf("capture ended by the daemon: tcpdump reads %d frames", n)
	}
	report(t, "capture: flood %d frames; drops 60 (%d from port 5001), passed 10, filtered 30; %v from the daemon's start",
		fr.Sent, ours, time.Since(start).Round(time.Millisecond))
}
