package loader_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// readOneFrame reads the next sample of r and a copy of its frame bytes.
func readOneFrame(t *testing.T, r *maps.SampleReader) (maps.Sample, []byte) {
	t.Helper()
	r.SetDeadline(time.Now().Add(2 * time.Second))
	s, err := r.Read()
	if err != nil {
		t.Fatalf("read sample: %v", err)
	}
	return s, append([]byte(nil), r.Frame()...)
}

// requireRingEmpty fails if r holds another sample.
func requireRingEmpty(t *testing.T, r *maps.SampleReader, ring string) {
	t.Helper()
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if s, err := r.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: another sample (%+v, %v), want one per packet", ring, s, err)
	}
}

// captureFrames are frames of every length class the snap length cuts
// differently (shorter than it, at it, one past it, far past it), IPv4 and
// IPv6, with VLAN tags, and random payload bytes so a copy from the wrong
// place cannot match.
func captureFrames(rng *rand.Rand) [][]byte {
	src4, src6 := netip.MustParseAddr("198.18.4.4"), netip.MustParseAddr("fd00::44")
	var out [][]byte
	for _, f := range []packet.Frame{
		{Src: src4, Proto: packet.ProtoUDP, SrcPort: 1000, DstPort: 53, Payload: 0},
		{Src: src4, Proto: packet.ProtoUDP, SrcPort: 1001, DstPort: 53, Payload: maps.SnapLen - 42},
		{Src: src4, Proto: packet.ProtoUDP, SrcPort: 1002, DstPort: 53, Payload: maps.SnapLen - 41},
		{Src: src4, Proto: packet.ProtoTCP, SrcPort: 1003, DstPort: 443, TCPFlags: 0x02, Payload: 1200},
		{Src: src6, Proto: packet.ProtoUDP, SrcPort: 1004, DstPort: 53, Payload: 10, VLANs: []uint16{100, 200}},
		{Src: src6, Proto: packet.ProtoTCP, SrcPort: 1005, DstPort: 443, TCPFlags: 0x10, Payload: 900},
	} {
		b := f.Build()
		hdr := len(b) - f.Payload
		for i := hdr; i < len(b); i++ {
			b[i] = byte(rng.Uint32())
		}
		out = append(out, b)
	}
	return out
}

// TestSampleFrameBytes: both samplers' samples carry the frame's first
// bytes exactly (at most maps.SnapLen of them) and its length, for frames
// shorter than, at, and past the snap length (BPF_PROG_TEST_RUN).
func TestSampleFrameBytes(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	drops, err := td.m.Samples.NewDropReader()
	if err != nil {
		t.Fatal(err)
	}
	defer drops.Close()
	rates, err := td.m.Samples.NewRateReader()
	if err != nil {
		t.Fatal(err)
	}
	defer rates.Close()

	// Every packet dropped by its rule, every one drop-sampled and chosen
	// by the 1-in-N sampler (one_in 1), under budgets never reached.
	g := generation(policy.CompiledRule{ID: 0, Action: policy.ActionDrop})
	g.Samples = policy.Limit{Rate: policy.Rate{Count: 1_000_000_000, Per: time.Second}, Burst: 1_000_000_000}
	g.Sampling = policy.Sampling{OneIn: 1, MaxPerSecond: 1_000_000}
	td.apply(g)
	frames := captureFrames(rand.New(rand.NewPCG(27, 2)))
	check := func(ring string, s maps.Sample, got, frame []byte, kind maps.SampleKind, act maps.Action) {
		t.Helper()
		want := frame[:min(len(frame), maps.SnapLen)]
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d-byte frame: sampled %d bytes\n got %x\nwant %x", ring, len(frame), len(got), got, want)
		}
		if int(s.FrameLen) != len(frame) || s.Kind != kind || s.Action != act {
			t.Errorf("%s: sample %+v, want frame length %d, kind %d, action %d", ring, s, len(frame), kind, act)
		}
	}
	for _, f := range frames {
		if td.run(f) != xdpDrop {
			t.Fatalf("%d-byte frame: not dropped", len(f))
		}
		s, got := readOneFrame(t, drops)
		check("drop samples", s, got, f, maps.SampleDrop, maps.ActDrop)
		if !s.HasRule || s.RuleSlot != 0 || s.Reason != maps.ReasonRuleDrop {
			t.Errorf("drop sample: %+v, want rule slot 0 known, reason rule_drop", s)
		}
		s, got = readOneFrame(t, rates)
		check("1-in-N samples", s, got, f, maps.SampleRate, maps.ActDrop)
		if !s.HasRule {
			t.Errorf("1-in-N sample: %+v, want its rule known", s)
		}
	}
	requireRingEmpty(t, drops, "drop samples")
	requireRingEmpty(t, rates, "1-in-N samples")

	// Passed packets: only the 1-in-N sampler sends them.
	g.Rules[0].Action = policy.ActionPass
	td.apply(g)
	for _, f := range frames {
		if td.run(f) != xdpPass {
			t.Fatalf("%d-byte frame: not passed", len(f))
		}
		s, got := readOneFrame(t, rates)
		check("1-in-N samples", s, got, f, maps.SampleRate, maps.ActPass)
		if s.Class != maps.ClassUnknown {
			t.Errorf("passed sample: class %d, want unknown (no aggregate looked the standing up)", s.Class)
		}
	}
	requireRingEmpty(t, drops, "drop samples")

	// A deny-list drop: no rule yet; only the 1-in-N sampler sends it.
	must(t, td.m.Lists.Set([]maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.4.0/24"), DenyUntil: maps.Forever, Origin: maps.OriginCLI}}))
	if td.run(frames[3]) != xdpDrop {
		t.Fatal("deny-listed frame: not dropped")
	}
	s, got := readOneFrame(t, rates)
	check("1-in-N samples", s, got, frames[3], maps.SampleRate, maps.ActDrop)
	if s.HasRule || s.Reason != maps.ReasonDeny {
		t.Errorf("deny-list sample: %+v, want no rule, reason deny_list", s)
	}
	requireRingEmpty(t, drops, "drop samples")
}
