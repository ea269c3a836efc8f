package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// decodeSampleReflect is the decode decodeSample replaced (binary.Read of
// the generated type), kept as its reference and as the peer in
// BenchmarkDecodeSample. Its field assignments do not compile if a field
// of loader.LimiterEgSample changes width.
func decodeSampleReflect(b []byte) (Sample, error) {
	var raw loader.LimiterEgSample
	buf := make([]byte, binary.Size(raw))
	if len(b) < 48 {
		return Sample{}, fmt.Errorf("decode sample: %d bytes, want at least 48: %w", len(b), ErrBadSample)
	}
	copy(buf, b)
	if err := binary.Read(bytes.NewReader(buf), binary.NativeEndian, &raw); err != nil {
		return Sample{}, fmt.Errorf("decode sample: %w: %w", ErrBadSample, err)
	}
	return Sample{
		Time:   time.Duration(raw.KtimeNs),
		Source: netip.AddrFrom16(raw.Addr).Unmap(),
		ASN:    raw.Asn, RuleSlot: raw.RuleSlot, HasRule: raw.HasRule != 0, Len: raw.IpLen, FrameLen: raw.Len, Proto: raw.Proto,
		SPort: raw.Sport, DPort: raw.Dport, TTL: raw.Ttl, TCPFlags: raw.TcpFlags,
		Reason: Reason(raw.Reason), Action: Action(raw.Action), Kind: SampleKind(raw.Kind),
		Passed: Action(raw.Action) != ActDrop, Weight: raw.Weight,
		Refusal: SampleKind(raw.Kind) == SampleDrop && raw.Refused != 0,
		Refused: Outcome(raw.Refused), RefusedAgg: ClassAgg(raw.RefusedAgg), Class: Class(raw.Cls),
	}, nil
}

// testSample is a sample with a distinct value in every field, each
// wider than its field's low byte where the field is wider than a byte.
func testSample() loader.LimiterEgSample {
	var addr [16]byte
	for i := range addr {
		addr[i] = byte(0x20 + i) // not v4-mapped
	}
	return loader.LimiterEgSample{
		KtimeNs: 0x0102030405060708, Addr: addr, Asn: 0x11121314, RuleSlot: 0x21222324,
		Len: 0x3132, Dport: 0x4142, Sport: 0x5152, Proto: 0x61, Reason: 0x62, Action: 0x63,
		Kind: uint8(SampleDrop), Ttl: 0x65, TcpFlags: 0x66, IpLen: 0x7172, Refused: 0x67, Cls: 0x68,
		Weight: 0x81828384, HasRule: 1, RefusedAgg: 0x69,
	}
}

func encodeSample(t testing.TB, raw loader.LimiterEgSample) []byte {
	var w bytes.Buffer
	if err := binary.Write(&w, binary.NativeEndian, raw); err != nil {
		t.Fatal(err)
	}
	return w.Bytes()
}

// TestDecodeSampleFields: every field of a record written by binary.Write
// of the generated type comes back, and equals the reflect decode's.
func TestDecodeSampleFields(t *testing.T) {
	raw := testSample()
	rec := encodeSample(t, raw)
	if len(rec) != sampleSize {
		t.Fatalf("binary.Write wrote %d bytes, sampleSize %d", len(rec), sampleSize)
	}
	s, err := decodeSample(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{
		Time: 0x0102030405060708, Source: netip.AddrFrom16(raw.Addr), ASN: 0x11121314, RuleSlot: 0x21222324, HasRule: true,
		Len: 0x7172, FrameLen: 0x3132, Proto: 0x61, SPort: 0x5152, DPort: 0x4142, TTL: 0x65, TCPFlags: 0x66,
		Reason: 0x62, Action: 0x63, Kind: SampleDrop, Passed: true, Weight: 0x81828384,
		Refusal: true, Refused: 0x67, RefusedAgg: 0x69, Class: 0x68,
	}
	if s != want {
		t.Errorf("decodeSample:\n got %+v\nwant %+v", s, want)
	}
	if r, err := decodeSampleReflect(rec); err != nil || r != s {
		t.Errorf("reflect decode: %+v, %v; decodeSample %+v", r, err, s)
	}

	// A v4-mapped address unmaps; a rate sample is no refusal; a drop
	// is not passed.
	raw.Addr = netip.MustParseAddr("::ffff:198.18.0.7").As16()
	raw.Kind, raw.Action = uint8(SampleRate), uint8(ActDrop)
	s, err = decodeSample(encodeSample(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	if s.Source != netip.MustParseAddr("198.18.0.7") || s.Refusal || s.Passed || s.Kind != SampleRate {
		t.Errorf("v4 rate drop: %+v", s)
	}
}

// TestDecodeSampleBounds: a record shorter than the oldest sample layout
// (everything before weight) is ErrBadSample (the reader skips it and
// reads on); one at that length decodes with weight zero, a truncated
// weight keeps the bytes it has, the full length or longer decodes whole.
// Every length agrees with the reflect decode.
func TestDecodeSampleBounds(t *testing.T) {
	if minSampleLen != 48 || sampleSize != 56+SnapLen {
		t.Fatalf("layout: minimum %d, size %d; the ring buffer's oldest records are 48 bytes", minSampleLen, sampleSize)
	}
	full := encodeSample(t, testSample())
	long := append(append([]byte(nil), full...), bytes.Repeat([]byte{0xff}, 4096-len(full))...)
	for n := 0; n <= len(long); n++ {
		if n > sampleSize+8 && n != len(long) {
			continue
		}
		s, err := decodeSample(long[:n])
		r, rerr := decodeSampleReflect(long[:n])
		if n < minSampleLen {
			if !errors.Is(err, ErrBadSample) {
				t.Errorf("%d bytes: err %v, want ErrBadSample", n, err)
			}
			continue
		}
		if err != nil || rerr != nil {
			t.Errorf("%d bytes: %v (reflect %v)", n, err, rerr)
			continue
		}
		if s != r {
			t.Errorf("%d bytes: %+v, reflect decode %+v", n, s, r)
		}
		if s.Time != 0x0102030405060708 || s.Class != 0x68 {
			t.Errorf("%d bytes: time %#x class %#x", n, int64(s.Time), s.Class)
		}
		var wantW uint32
		switch {
		case n == minSampleLen:
		case n >= minSampleLen+4:
			wantW = 0x81828384
		default:
			var w [4]byte
			copy(w[:], full[minSampleLen:n])
			wantW = binary.NativeEndian.Uint32(w[:])
		}
		if s.Weight != wantW {
			t.Errorf("%d bytes: weight %#x, want %#x", n, s.Weight, wantW)
		}
	}
}

// TestSampleFrame: a record's frame bytes are cap_len of them, never more
// than SnapLen nor past the record's end (a hostile or truncated cap_len);
// a record from before capture (ending at weight) has none.
func TestSampleFrame(t *testing.T) {
	raw := testSample()
	for i := range raw.Frame {
		raw.Frame[i] = byte(i + 1)
	}
	for _, tc := range []struct {
		capLen uint16
		cut    int // record length; 0: whole
		want   int
	}{
		{0, 0, 0}, {1, 0, 1}, {60, 0, 60}, {uint16(SnapLen), 0, SnapLen}, {uint16(SnapLen) + 1, 0, SnapLen},
		{0xffff, 0, SnapLen}, {100, offSampleFrame + 10, 10}, {100, offSampleFrame, 0}, {100, minSampleLen + 4, 0},
		{100, minSampleLen, 0}, {100, 1, 0},
	} {
		raw.CapLen = tc.capLen
		rec := encodeSample(t, raw)
		if tc.cut > 0 {
			rec = rec[:tc.cut]
		}
		got := sampleFrame(rec)
		if len(got) != tc.want || !bytes.Equal(got, raw.Frame[:tc.want]) {
			t.Errorf("cap_len %d, %d-byte record: %d bytes %x, want the first %d", tc.capLen, len(rec), len(got), got, tc.want)
		}
	}
}

// BenchmarkDecodeSample: the fixed-offset decode against the binary.Read
// decode it replaced (reflect), in the same run; fixed reports its time as
// a ratio to the peer's (x-reflect).
func BenchmarkDecodeSample(b *testing.B) {
	rec := encodeSample(b, testSample())
	var sink Sample
	run := func(b *testing.B, dec func([]byte) (Sample, error)) float64 {
		b.ReportAllocs()
		for b.Loop() {
			s, err := dec(rec)
			if err != nil {
				b.Fatal(err)
			}
			sink = s
		}
		return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	}
	var peer float64
	b.Run("reflect", func(b *testing.B) { peer = run(b, decodeSampleReflect) })
	b.Run("fixed", func(b *testing.B) {
		ns := run(b, decodeSample)
		if peer > 0 {
			b.ReportMetric(ns/peer, "x-reflect")
		}
	})
	_ = sink
}
