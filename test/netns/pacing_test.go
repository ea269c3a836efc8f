package netns_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/trafficgen"
	"github.com/edgeguard/edgeguard/test/netns"
)

// arrivalGaps floods the edge's UDP socket at rate for d and returns the
// gaps between the frames' arrivals (kernel receive timestamps).
func arrivalGaps(t *testing.T, f trafficgen.Flood, open func() (*trafficgen.PacketConn, error), recv func(n int) []time.Duration) ([]time.Duration, trafficgen.FloodResult) {
	t.Helper()
	pc, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	done := make(chan []time.Duration, 1)
	go func() { done <- recv(f.Count) }()
	r, err := f.Run(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	stamps := <-done
	var gaps []time.Duration
	for i := 1; i < len(stamps); i++ {
		gaps = append(gaps, stamps[i]-stamps[i-1])
	}
	return gaps, r
}

// TestFloodDeadlines: a flood with per-frame deadlines (Flood.Deadlines: a
// SCHED_FIFO sender) arrives with its frames at their scheduled times,
// where the generator's steps (Step 100 µs, a normal goroutine) let the
// frames due while it slept leave back to back, the more so the more
// loaded the machine. Evenly spaced at 10,000/s (one frame every 100 µs)
// for 2 s: the share of gaps under 25 µs (two frames in one clump) is
// printed for both with the load average, and with deadlines must stay
// under 0.75× the steps' share in the same run. Then the known-good
// scenarios' flood (15,000/s Poisson, deadlines) reports how many frames
// the sender reached more than 1 ms late and did not send. Measured with
// that 1 ms cut-off (docs/testbed.md): steps 50-53%, deadlines 3.0-4.1% at
// load 0.5; steps 52.4%, deadlines 18.2% on a quiet CI run at load 0.3.
func TestFloodDeadlines(t *testing.T) {
	tb := netns.New(t)
	s := tb.Star(1)
	c := s.Clients[0]
	if err := s.AcceptSpoofed(c, attackerNet); err != nil {
		t.Fatal(err)
	}
	sink, err := s.Edge.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), 9009))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	sink.SetReadBuffer(8 << 20)
	raw, err := sink.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) }); err != nil || serr != nil {
		t.Fatalf("SO_TIMESTAMPNS: %v %v", err, serr)
	}
	recv := func(n int) []time.Duration {
		var out []time.Duration
		buf, oob := make([]byte, 2048), make([]byte, 256)
		for len(out) < n {
			sink.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, oobn, _, _, err := sink.ReadMsgUDP(buf, oob)
			if err != nil {
				return out // the flood is over (os.ErrDeadlineExceeded)
			}
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				continue
			}
			for _, m := range msgs {
				if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
					sec := int64(binary.NativeEndian.Uint64(m.Data[0:]))
					nsec := int64(binary.NativeEndian.Uint64(m.Data[8:]))
					out = append(out, time.Duration(sec*1e9+nsec))
				}
			}
		}
		return out
	}
	base := trafficgen.Flood{SrcMAC: c.Link.B.MAC, DstMAC: c.Link.A.MAC, DstPort: 9009, Proto: trafficgen.UDP, Payload: 20,
		Dst: c.EdgeAddr4, Sources: []netip.Prefix{attackerNet}, Distinct: 100, Rate: 10_000, Count: 20_000,
		Duration: 3 * time.Second, Seed: 5}
	clumped := func(gaps []time.Duration) (float64, time.Duration) {
		n := 0
		for _, g := range gaps {
			if g < 25*time.Microsecond {
				n++
			}
		}
		s := slices.Clone(gaps)
		slices.Sort(s)
		return float64(n) / float64(max(len(gaps), 1)), s[len(s)*99/100]
	}
	user := base
	user.Step = 100 * time.Microsecond
	ug, ur := arrivalGaps(t, user, func() (pc *trafficgen.PacketConn, err error) {
		err = c.NS.Do(func() (err error) { pc, err = trafficgen.OpenPacketConn(c.Link.B.Index); return err })
		return pc, err
	}, recv)
	dl := base
	dl.Deadlines = true
	kg, kr := arrivalGaps(t, dl, func() (pc *trafficgen.PacketConn, err error) {
		err = c.NS.Do(func() (err error) { pc, err = trafficgen.OpenPacketConn(c.Link.B.Index); return err })
		return pc, err
	}, recv)
	// The known-good scenarios' flood: 15,000/s Poisson; how many frames
	// the sender reached too late.
	bots := dl
	bots.Rate, bots.Count, bots.Poisson = 15_000, 30_000, true
	_, br := arrivalGaps(t, bots, func() (pc *trafficgen.PacketConn, err error) {
		err = c.NS.Do(func() (err error) { pc, err = trafficgen.OpenPacketConn(c.Link.B.Index); return err })
		return pc, err
	}, recv)
	report(t, "15,000/s Poisson with deadlines: sent %d, late %d (%.1f%%) of 30,000 in %v", br.Sent, br.Late,
		100*float64(br.Late)/30_000, br.Elapsed.Round(time.Millisecond))
	if len(ug) < 1000 || len(kg) < 1000 {
		t.Fatalf("too few arrivals: %d (generator's steps, %+v), %d (per-frame deadlines, %+v)", len(ug), ur, len(kg), kr)
	}
	uc, up := clumped(ug)
	kc, kp := clumped(kg)
	load, _ := os.ReadFile("/proc/loadavg")
	report(t, "load %s; 10,000/s evenly spaced: generator's 100 µs steps %.1f%% of gaps under 25 µs, p99 gap %v (%d arrivals, sent %d); "+
		"per-frame deadlines %.1f%% under 25 µs, p99 gap %v (%d arrivals, sent %d, late %d); deadlines/steps %.2f (want under 0.75)",
		strings.TrimSpace(string(load)), 100*uc, up, len(ug)+1, ur.Sent, 100*kc, kp, len(kg)+1, kr.Sent, kr.Late, kc/max(uc, 1e-9))
	// Compared with the stepped generator in the same run, not with a
	// fixed share: how many gaps clump with deadlines depends on the
	// machine (3.0-4.1% at load 0.5, 18.2% on a quiet CI run, against
	// 50-53% for the steps).
	if kc >= 0.75*uc {
		t.Errorf("per-frame deadlines: %.1f%% of gaps under 25 µs against the steps' %.1f%%: want under 0.75×", 100*kc, 100*uc)
	}
}
