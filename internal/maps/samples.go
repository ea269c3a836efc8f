package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// SampleKind says which sampler sent a sample (enum eg_sample_kind).
type SampleKind = loader.LimiterEgSampleKind

// Sample kinds.
const (
	// SampleDrop is a dropped (or would-drop) packet within the drop-sample
	// budget (top talkers, explain): NewSampleReader.
	SampleDrop = loader.LimiterEgSampleKindEG_SAMPLE_DROP
	// SampleRate is a packet chosen 1 in sampling.one_in at random, passed
	// or dropped, within sampling.max_per_second: SampleStore.NewRateReader.
	SampleRate = loader.LimiterEgSampleKindEG_SAMPLE_RATE
)

// Sample is one sampled packet reported by the data plane.
type Sample struct {
	Time     time.Duration // CLOCK_MONOTONIC
	Source   netip.Addr
	ASN      uint32
	RuleSlot uint32 // the rule's table slot (see Maps.RuleSlots), not its id
	// HasRule: RuleSlot is the packet's rule; false for verdicts before a
	// rule is known (lists, malformed frames, no policy; and every sample
	// of a program from before capture).
	HasRule  bool
	Len      uint16 // IP total length (IPv6: 40 + payload length)
	FrameLen uint16 // the frame's length
	Proto    uint8
	SPort    uint16
	DPort    uint16
	TTL      uint8 // TTL or hop limit
	TCPFlags uint8 // 0 for other protocols
	Reason   Reason
	Action   Action
	Kind     SampleKind
	// Passed: the packet went on (pass, or a dry-run rule's would-drop).
	Passed bool
	// Weight is how many packets a SampleRate sample stands for: one_in,
	// times one more for each chosen packet its CPU could not send since
	// its last sample (over the cap, ring buffer full). The rate of
	// anything is the sum of its samples' weights over the interval. 0
	// for SampleDrop samples.
	Weight uint32
	// Refused: OutcomeRefusedReserve or OutcomeRefusedFull when an
	// aggregate refused the packet (the one the Reason names, or under an
	// override the one RefusedAgg names); Refusal (SampleDrop only) false
	// otherwise. Class (both kinds) is the source's
	// class there (ClassUnknown: its standing was not looked up, as for
	// every packet no aggregate refused; from a program before capture,
	// ClassNew in 1-in-N samples).
	Refusal bool
	Refused Outcome
	// RefusedAgg is the kind of aggregate that refused (prefix, whole
	// included; ASN; global), with Refused. The Reason names it too for
	// prefix_limit, asn_limit and global_limit, but not when an override
	// refused (shield_tighten, fleet_share, override). From a program
	// before it, ClassAggPrefix (0) for every refusal.
	RefusedAgg ClassAgg
	Class      Class
}

// SnapLen is how many of a frame's first bytes a sample carries at most
// (EG_SNAP_LEN): SampleReader.Frame.
const SnapLen = int(loader.LimiterEgSizesEG_SNAP_LEN)

// SampleReader reads samples from one of the data plane's ring buffers.
// Read is for one goroutine at a time.
type SampleReader struct {
	r   *ringbuf.Reader
	rec ringbuf.Record // reused by Read: no allocation per record
}

// NewSampleReader opens the drop-sample ring buffer (SampleDrop).
func (m *SampleStore) NewDropReader() (*SampleReader, error) {
	r, err := ringbuf.NewReader(m.o.Samples)
	if err != nil {
		return nil, fmt.Errorf("open sample ring buffer: %w", err)
	}
	return &SampleReader{r: r}, nil
}

// NewRateReader opens the 1-in-N sample ring buffer (SampleRate).
// One reader at a time: readers of one ring buffer share its records.
func (m *SampleStore) NewRateReader() (*SampleReader, error) {
	r, err := ringbuf.NewReader(m.o.RateSamples)
	if err != nil {
		return nil, fmt.Errorf("open rate sample ring buffer: %w", err)
	}
	return &SampleReader{r: r}, nil
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t.
func (s *SampleReader) SetDeadline(t time.Time) { s.r.SetDeadline(t) }

// Read blocks for the next sample.
func (s *SampleReader) Read() (Sample, error) {
	if err := s.r.ReadInto(&s.rec); err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return Sample{}, err
		}
		return Sample{}, fmt.Errorf("read sample: %w", err)
	}
	return decodeSample(s.rec.RawSample)
}

// Frame is the first bytes (at most SnapLen) of the frame of the sample
// Read returned last, valid until the next Read; empty for a sample without
// them (a program from before capture).
func (s *SampleReader) Frame() []byte { return sampleFrame(s.rec.RawSample) }

// sampleFrame is a record's frame bytes: cap_len of them, bounded by
// SnapLen and by the record.
func sampleFrame(b []byte) []byte {
	if len(b) < offSampleFrame {
		return nil
	}
	n := min(int(binary.NativeEndian.Uint16(b[offSampleCapLen:])), SnapLen, len(b)-offSampleFrame)
	return b[offSampleFrame : offSampleFrame+n]
}

// ErrBadSample is the error of a ring buffer record too short to be a
// sample: the reader may skip it and read on.
var ErrBadSample = errors.New("bad sample record")

// The byte offsets of struct eg_sample's fields, taken from the generated
// type so they follow the C layout (TestDecodeSampleFields checks the
// widths read at them).
const (
	sampleSize     = int(unsafe.Sizeof(loader.LimiterEgSample{}))
	offSampleKtime = unsafe.Offsetof(loader.LimiterEgSample{}.KtimeNs)
	offSampleAddr  = unsafe.Offsetof(loader.LimiterEgSample{}.Addr)
	offSampleAsn   = unsafe.Offsetof(loader.LimiterEgSample{}.Asn)
	offSampleRule  = unsafe.Offsetof(loader.LimiterEgSample{}.RuleSlot)
	offSampleLen   = unsafe.Offsetof(loader.LimiterEgSample{}.Len)
	offSampleDport = unsafe.Offsetof(loader.LimiterEgSample{}.Dport)
	offSampleSport = unsafe.Offsetof(loader.LimiterEgSample{}.Sport)
	offSampleProto = unsafe.Offsetof(loader.LimiterEgSample{}.Proto)
	offSampleRsn   = unsafe.Offsetof(loader.LimiterEgSample{}.Reason)
	offSampleAct   = unsafe.Offsetof(loader.LimiterEgSample{}.Action)
	offSampleKind  = unsafe.Offsetof(loader.LimiterEgSample{}.Kind)
	offSampleTTL   = unsafe.Offsetof(loader.LimiterEgSample{}.Ttl)
	offSampleFlags = unsafe.Offsetof(loader.LimiterEgSample{}.TcpFlags)
	offSampleIPLen = unsafe.Offsetof(loader.LimiterEgSample{}.IpLen)
	offSampleRefd  = unsafe.Offsetof(loader.LimiterEgSample{}.Refused)
	offSampleCls   = unsafe.Offsetof(loader.LimiterEgSample{}.Cls)
	offSampleWt    = unsafe.Offsetof(loader.LimiterEgSample{}.Weight)
	// A record from before capture ends at weight: no frame.
	offSampleCapLen = int(unsafe.Offsetof(loader.LimiterEgSample{}.CapLen))
	offSampleFrame  = int(unsafe.Offsetof(loader.LimiterEgSample{}.Frame))
	offSampleHasRul = unsafe.Offsetof(loader.LimiterEgSample{}.HasRule)
	offSampleRefAgg = unsafe.Offsetof(loader.LimiterEgSample{}.RefusedAgg)
	// minSampleLen is the oldest program's record: everything before
	// weight, which came later.
	minSampleLen = int(offSampleWt)
)

// decodeSample decodes one ring buffer record. A shorter record (written
// by an older program, still attached during an upgrade) leaves the fields
// it lacks zero; a longer one (a newer program) has its extra bytes
// ignored. It reads fixed offsets rather than binary.Read: no reflection
// and no allocation per record (BenchmarkDecodeSample).
func decodeSample(b []byte) (Sample, error) {
	if len(b) < minSampleLen {
		return Sample{}, fmt.Errorf("decode sample: %d bytes, want at least %d: %w", len(b), minSampleLen, ErrBadSample)
	}
	var buf [offSampleFrame]byte // the fields, not the frame; zero past a short record's end
	copy(buf[:], b)
	ne := binary.NativeEndian
	kind := SampleKind(buf[offSampleKind])
	act := Action(buf[offSampleAct])
	refused := buf[offSampleRefd]
	return Sample{
		Time:       time.Duration(ne.Uint64(buf[offSampleKtime:])),
		Source:     netip.AddrFrom16([16]byte(buf[offSampleAddr:])).Unmap(),
		ASN:        ne.Uint32(buf[offSampleAsn:]),
		RuleSlot:   ne.Uint32(buf[offSampleRule:]),
		HasRule:    buf[offSampleHasRul] != 0,
		Len:        ne.Uint16(buf[offSampleIPLen:]),
		FrameLen:   ne.Uint16(buf[offSampleLen:]),
		Proto:      buf[offSampleProto],
		SPort:      ne.Uint16(buf[offSampleSport:]),
		DPort:      ne.Uint16(buf[offSampleDport:]),
		TTL:        buf[offSampleTTL],
		TCPFlags:   buf[offSampleFlags],
		Reason:     Reason(buf[offSampleRsn]),
		Action:     act,
		Kind:       kind,
		Passed:     act != ActDrop,
		Weight:     ne.Uint32(buf[offSampleWt:]),
		Refusal:    kind == SampleDrop && refused != 0,
		Refused:    Outcome(refused),
		RefusedAgg: ClassAgg(buf[offSampleRefAgg]),
		Class:      Class(buf[offSampleCls]),
	}, nil
}

// Close stops the reader; a blocked Read returns ringbuf.ErrClosed.
func (s *SampleReader) Close() error { return s.r.Close() }

// SamplingConfig is the data plane's form of the sampling: section: a
// packet is chosen when a 32-bit random number is below 2^32 / one_in
// (rounded down: the probability is 1/one_in less at most 2^-32), and at
// most max_per_second chosen packets are sent per second (a GCRA bucket
// with a burst of a tenth of a second's worth, at least 1).
func SamplingConfig(s policy.Sampling) (loader.LimiterEgSampleCfg, error) {
	var c loader.LimiterEgSampleCfg
	if s.OneIn == 0 || s.MaxPerSecond == 0 {
		return c, nil // off
	}
	cap, err := BucketConfig(policy.Bucket{Packets: policy.Limit{
		Rate: policy.Rate{Count: s.MaxPerSecond, Per: time.Second}, Burst: max(s.MaxPerSecond/10, 1)}})
	if err != nil {
		return c, fmt.Errorf("sampling.max_per_second: %w", err)
	}
	c.Cap = cap
	c.OneIn = s.OneIn
	c.Thresh = uint32((uint64(1) << 32) / uint64(s.OneIn))
	if s.OneIn == 1 {
		c.Thresh = ^uint32(0) // every packet but 1 in 2^32
	}
	return c, nil
}

// SamplerCounters are the 1-in-N sampler's counters, summed over CPUs.
type SamplerCounters struct {
	Chosen uint64 // packets chosen
	Sent   uint64 // samples sent
	Capped uint64 // chosen, not sent: over max_per_second
	Lost   uint64 // chosen, not sent: the ring buffer was full (no reader, or a slow one)
}

// SamplerCounters reads the 1-in-N sampler's counters.
func (m *SampleStore) Counters() (SamplerCounters, error) {
	var per []loader.LimiterEgRsampleStats
	if err := m.o.RateSampleStats.Lookup(uint32(0), &per); err != nil {
		return SamplerCounters{}, fmt.Errorf("read sampler counters: %w", err)
	}
	var out SamplerCounters
	for _, c := range per {
		out.Chosen += c.Chosen
		out.Sent += c.Sent
		out.Capped += c.Capped
		out.Lost += c.Lost
	}
	return out, nil
}
