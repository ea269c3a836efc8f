package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// Sample is one dropped (or would-drop) packet reported by the data plane.
type Sample struct {
	Time   time.Duration // CLOCK_MONOTONIC
	Source netip.Addr
	ASN    uint32
	RuleID uint32 // the rule's table slot (see Maps.RuleSlots), not its id
	Len    uint16
	Proto  uint8
	SPort  uint16
	DPort  uint16
	Reason Reason
	Action Action
}

// SampleReader reads drop samples from the ring buffer.
type SampleReader struct{ r *ringbuf.Reader }

// NewSampleReader opens the sample ring buffer.
func (m *Maps) NewSampleReader() (*SampleReader, error) {
	r, err := ringbuf.NewReader(m.o.Samples)
	if err != nil {
		return nil, fmt.Errorf("open sample ring buffer: %w", err)
	}
	return &SampleReader{r: r}, nil
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t.
func (s *SampleReader) SetDeadline(t time.Time) { s.r.SetDeadline(t) }

// Read blocks for the next sample.
func (s *SampleReader) Read() (Sample, error) {
	rec, err := s.r.Read()
	if err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return Sample{}, err
		}
		return Sample{}, fmt.Errorf("read sample: %w", err)
	}
	var raw loader.LimiterEgSample
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
		return Sample{}, fmt.Errorf("decode sample: %w", err)
	}
	return Sample{
		Time:   time.Duration(raw.KtimeNs),
		Source: netip.AddrFrom16(raw.Addr).Unmap(),
		ASN:    raw.Asn, RuleID: raw.RuleId, Len: raw.Len, Proto: raw.Proto,
		SPort: raw.Sport, DPort: raw.Dport, Reason: Reason(raw.Reason), Action: Action(raw.Action),
	}, nil
}

// Close stops the reader; a blocked Read returns ringbuf.ErrClosed.
func (s *SampleReader) Close() error { return s.r.Close() }
