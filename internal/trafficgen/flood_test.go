package trafficgen

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/packet"
)

func TestRandomInStaysInPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range []string{"198.19.0.0/16", "0.0.0.0/0", "10.1.2.3/32", "10.0.0.0/13", "fd00:0:0:c8::/64", "fd00::/8", "fd00::1/128"} {
		pfx := netip.MustParsePrefix(p)
		seen := map[netip.Addr]bool{}
		for i := 0; i < 2000; i++ {
			a := randomIn(rng, pfx)
			if !pfx.Contains(a) || a.Is4() != pfx.Addr().Is4() {
				t.Fatalf("randomIn(%s) = %s", p, a)
			}
			seen[a] = true
		}
		if free := (map[bool]int{true: 32, false: 128})[pfx.Addr().Is4()] - pfx.Bits(); free >= 16 && len(seen) < 1900 {
			t.Errorf("randomIn(%s): only %d distinct of 2000", p, len(seen))
		}
	}
}

// TestChecksums checks every L4 checksum the generator writes the way a
// receiver does: the one's-complement sum over pseudo-header and segment
// is 0xffff.
func TestChecksums(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	for _, tc := range []struct {
		src, dst string
		proto    Proto
	}{
		{"198.19.1.2", "198.18.200.1", UDP}, {"198.19.1.2", "198.18.200.1", TCPSYN}, {"198.19.1.2", "198.18.200.1", ICMP},
		{"fd00:0:0:c8::1234", "fd00:0:0:c8::1", UDP}, {"fd00:0:0:c8::1234", "fd00:0:0:c8::1", TCPSYN},
		{"fd00:0:0:c8::1234", "fd00:0:0:c8::1", ICMP},
	} {
		f := Flood{SrcMAC: mac, DstMAC: mac, Dst: netip.MustParseAddr(tc.dst), Proto: tc.proto, DstPort: 9009, Payload: 33}
		b := f.frame(netip.MustParseAddr(tc.src), 53)
		var sum uint32
		var l4 []byte
		if tc.proto != ICMP || strings.Contains(tc.src, ":") {
			if binary.BigEndian.Uint16(b[12:]) == packet.EtherTypeIPv4 {
				ip := b[14:34]
				l4 = b[34:]
				sum = sum16(ip[12:20]) + uint32(ip[9]) + uint32(len(l4))
			} else {
				ip := b[14:54]
				l4 = b[54:]
				sum = sum16(ip[8:40]) + uint32(ip[6]) + uint32(len(l4))
			}
		} else {
			l4 = b[34:]
		}
		if got := fold(sum + sum16(l4)); got != 0 {
			t.Errorf("%s %s: checksum does not verify (folded complement %#04x)", tc.src, tc.proto, got)
		}
	}
}

func TestFloodBounds(t *testing.T) {
	ok := Flood{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6), Dst: netip.MustParseAddr("198.18.0.1"),
		Sources: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}, Rate: 10, Count: 10, Duration: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Flood){
		"no count":       func(f *Flood) { f.Count = 0 },
		"no duration":    func(f *Flood) { f.Duration = 0 },
		"no rate":        func(f *Flood) { f.Rate = 0 },
		"huge count":     func(f *Flood) { f.Count = MaxFloodPackets + 1 },
		"long":           func(f *Flood) { f.Duration = MaxFloodDuration + 1 },
		"fast":           func(f *Flood) { f.Rate = MaxFloodRate + 1 },
		"no sources":     func(f *Flood) { f.Sources = nil },
		"mixed families": func(f *Flood) { f.Sources = []netip.Prefix{netip.MustParsePrefix("fd00::/64")} },
	} {
		f := ok
		mod(&f)
		if err := f.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
		if _, err := f.Run(context.Background(), nil); err == nil {
			t.Errorf("%s: Run accepted it", name)
		}
	}
	if err := checkLegitBounds(10, 0, time.Second); err == nil {
		t.Error("legit traffic without a count accepted")
	}
	if err := checkLegitBounds(10, 10, 0); err == nil {
		t.Error("legit traffic without a duration accepted")
	}
}

// TestFloodStepBounds: a pacing step under MinFloodStep or over a second
// is refused; 0 is the default.
func TestFloodStepBounds(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	f := Flood{SrcMAC: mac, DstMAC: mac, Dst: netip.MustParseAddr("198.18.200.1"),
		Sources: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}, Rate: 10, Count: 1, Duration: time.Second}
	for _, step := range []time.Duration{0, MinFloodStep, 100 * time.Microsecond, time.Second} {
		f.Step = step
		if err := f.Validate(); err != nil {
			t.Errorf("step %v: %v", step, err)
		}
	}
	for _, step := range []time.Duration{-1, MinFloodStep - 1, time.Second + 1} {
		f.Step = step
		if err := f.Validate(); err == nil {
			t.Errorf("step %v accepted", step)
		}
	}
}

// TestPoissonPacing: per 100 µs step, evenly spaced frames come 1 or 2 at
// a time (variance far below the mean), Poisson ones with a variance about
// the mean, at the same average rate; both stop at Count.
func TestPoissonPacing(t *testing.T) {
	const step, steps = 100_000, 20_000 // ns, 2 s
	for _, poisson := range []bool{false, true} {
		f := Flood{Rate: 14_600, Count: 1_000_000, Seed: 7, Poisson: poisson}
		p := f.pacer()
		var n uint64
		var sum, sumSq float64
		for i := 1; i <= steps; i++ {
			due := p.due(n, uint64(i*step))
			k := float64(due - n)
			sum, sumSq, n = sum+k, sumSq+k*k, due
		}
		mean := sum / steps
		variance := sumSq/steps - mean*mean
		if mean < 1.36 || mean > 1.56 {
			t.Errorf("poisson %v: %.3f frames per step, want 1.46 ± 0.1", poisson, mean)
		}
		if poisson && (variance < 0.8*mean || variance > 1.2*mean) {
			t.Errorf("poisson: variance %.3f per step, want about the mean %.3f", variance, mean)
		}
		if !poisson && variance > 0.3 {
			t.Errorf("even: variance %.3f per step, want under 0.3", variance)
		}
	}
	p := Flood{Rate: 1000, Count: 5, Seed: 1, Poisson: true}.pacer()
	if got := p.due(0, uint64(time.Hour)); got != 5 {
		t.Errorf("poisson pacer after an hour: %d due, want Count 5", got)
	}
}

// TestDeadlinePrebuild: a flood with deadlines builds, in order, the frames
// it sends within its duration (10% more for Poisson), and no more than
// Count; past deadlinePrebuild bytes it builds only the first.
func TestDeadlinePrebuild(t *testing.T) {
	var calls []uint64
	send := func(n uint64) []byte {
		calls = append(calls, n)
		return make([]byte, 100)
	}
	for _, tc := range []struct {
		f    Flood
		want int
	}{
		{Flood{Rate: 1000, Count: 5000, Duration: 2 * time.Second}, 2300},
		{Flood{Rate: 1000, Count: 50, Duration: 2 * time.Second}, 50},
		{Flood{Rate: 2_000_000, Count: 20_000_000, Duration: time.Minute}, 1}, // 2 GB: built as it goes
	} {
		calls = calls[:0]
		got := tc.f.prebuild(send)
		if len(got) != tc.want || len(calls) != tc.want {
			t.Errorf("%+v: %d frames built (%d calls), want %d", tc.f, len(got), len(calls), tc.want)
		}
		for i, n := range calls {
			if n != uint64(i) {
				t.Fatalf("frame %d built as %d: out of order", i, n)
			}
		}
	}
}
