package loader_test

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// runN runs one frame n times in the kernel (BPF_PROG_TEST_RUN repeat).
func (td *testDatapath) runN(frame []byte, n int) uint32 {
	td.tb.Helper()
	ret, err := td.d.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: frame, Repeat: uint32(n)})
	if err != nil {
		td.tb.Fatalf("prog test run: %v", err)
	}
	return ret
}

// drainRateSamples reads every 1-in-N sample the ring buffer holds.
func drainRateSamples(t *testing.T, r *maps.SampleReader) []maps.Sample {
	t.Helper()
	var out []maps.Sample
	for {
		r.SetDeadline(time.Now().Add(200 * time.Millisecond))
		s, err := r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
}

func samplingGen(oneIn uint32, perSecond uint64) policy.Compiled {
	g := generation(policy.CompiledRule{ID: 0})
	g.Sampling = policy.Sampling{OneIn: oneIn, MaxPerSecond: perSecond}
	return g
}

// TestRateSamplingEstimate: with one_in 16 and a cap that is never
// reached, the sum of the weights of passed and of dropped packets each
// estimates their count within a binomial bound (5 standard deviations:
// a false failure about once in 1.7 million runs), and the samples carry
// the packet's fields.
func TestRateSamplingEstimate(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	g := samplingGen(16, 1_000_000)
	td.apply(g)
	must(t, td.m.Lists.Set([]maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.9.0/24"), DenyUntil: maps.Forever, Origin: maps.OriginCLI}}))
	r, err := td.m.Samples.NewRateReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	const n = 20000
	pass := packet.Frame{Src: netip.MustParseAddr("198.18.1.1"), Proto: packet.ProtoTCP, SrcPort: 40000, DstPort: 443,
		Payload: 30, TCPFlags: 0x02}.Build()
	pass[14+8] = 57 // TTL (the parser does not check the header checksum)
	drop := packet.UDP4("198.18.9.9", 5000, 53, 100)
	if td.runN(pass, n) != xdpPass || td.runN(drop, n) != xdpDrop {
		t.Fatal("verdicts: want pass and drop (deny list)")
	}
	var sum [2]uint64 // dropped, passed
	var cnt [2]int
	for _, s := range drainRateSamples(t, r) {
		if s.Kind != maps.SampleRate || s.Weight != 16 {
			t.Fatalf("sample kind %d weight %d, want a rate sample of weight 16: %+v", s.Kind, s.Weight, s)
		}
		i := 0
		if s.Passed {
			i = 1
			if s.Source != netip.MustParseAddr("198.18.1.1") || s.Proto != 6 || s.SPort != 40000 || s.DPort != 443 ||
				s.TTL != 57 || s.TCPFlags != 0x02 || s.Len != 20+20+30 || s.Action != maps.ActPass {
				t.Fatalf("passed sample: %+v", s)
			}
		} else if s.Source != netip.MustParseAddr("198.18.9.9") || s.Proto != 17 || s.DPort != 53 || s.TTL != 64 ||
			s.TCPFlags != 0 || s.Len != 20+8+100 || s.Action != maps.ActDrop || s.Reason != maps.ReasonDeny {
			t.Fatalf("dropped sample: %+v", s)
		}
		sum[i] += uint64(s.Weight)
		cnt[i]++
	}
	sd := math.Sqrt(n * (1.0 / 16) * (15.0 / 16))
	for i, name := range []string{"dropped", "passed"} {
		est := float64(sum[i])
		if math.Abs(est-n) > 16*5*sd {
			t.Errorf("%s: estimate %v from %d samples, want %d within %v", name, est, cnt[i], n, 16*5*sd)
		}
		t.Logf("%s: %d samples, estimate %v of %d", name, cnt[i], est, n)
	}
	c, err := td.m.Samples.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Chosen != uint64(cnt[0]+cnt[1]) || c.Sent != c.Chosen || c.Capped != 0 || c.Lost != 0 {
		t.Fatalf("sampler counters %+v, want %d chosen and sent", c, cnt[0]+cnt[1])
	}
}

// TestRateSamplingCapKeepsWeight: over the cap, chosen packets are not
// sent, and the next sample of the CPU carries their weight: the weights
// always add up to one_in times the packets chosen.
func TestRateSamplingCapKeepsWeight(t *testing.T) {
	// The weight of capped packets is carried per CPU (to that CPU's next
	// sample): every run of this test must be on one CPU, or the second
	// sample comes from a CPU that carries nothing.
	pinToOneCPU(t)
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(samplingGen(16, 10)) // 10/s, a burst of 1
	r, err := td.m.Samples.NewRateReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	frame := packet.UDP4("198.18.1.1", 5000, 53, 10)
	td.runN(frame, 20000) // on a frozen clock: one sample goes out
	got := drainRateSamples(t, r)
	c, err := td.m.Samples.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Weight != 16 || c.Sent != 1 || c.Capped != c.Chosen-1 || c.Chosen < 1000 {
		t.Fatalf("at the cap: %d samples %+v, counters %+v", len(got), got, c)
	}
	// A tenth of a second later the cap admits one more: it stands for
	// every packet chosen since the first.
	td.setClock(ovrStart + 100*time.Millisecond)
	for i := 0; i < 1000; i++ {
		td.run(frame)
		if c2, _ := td.m.Samples.Counters(); c2.Sent == 2 {
			break
		}
	}
	got = append(got, drainRateSamples(t, r)...)
	c, err = td.m.Samples.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || c.Sent != 2 {
		t.Fatalf("after the refill: %d samples, counters %+v", len(got), c)
	}
	if sum := uint64(got[0].Weight) + uint64(got[1].Weight); sum != 16*c.Chosen {
		t.Fatalf("weights %d + %d = %d, want 16 x %d chosen", got[0].Weight, got[1].Weight, sum, c.Chosen)
	}
}

// TestRateSamplingOff: one_in 0 chooses nothing.
func TestRateSamplingOff(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(samplingGen(0, 1000))
	td.runN(packet.UDP4("198.18.1.1", 5000, 53, 10), 10000)
	c, err := td.m.Samples.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Chosen != 0 {
		t.Fatalf("sampling off: %+v", c)
	}
}

// pinToOneCPU keeps the calling goroutine on its OS thread and that thread
// on CPU 0 until the test ends (BPF_PROG_TEST_RUN runs the program on the
// calling thread's CPU).
func pinToOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("sched_getaffinity: %v", err)
	}
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("sched_setaffinity: %v", err)
	}
	t.Cleanup(func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}
