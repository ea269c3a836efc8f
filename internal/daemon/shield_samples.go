package daemon

import (
	"context"
	"errors"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// sampleWeight is how many packets a sample stands for: only the data
// plane's 1-in-N samples (SampleRate) stand for a rate.
func sampleWeight(s maps.Sample) (float64, bool) {
	if s.Kind != maps.SampleRate || s.Weight == 0 {
		return 0, false
	}
	return float64(s.Weight), true
}

// sampleFields copies the header fields 1-in-N samples carry.
func sampleFields(out *shield.Sample, s maps.Sample) {
	out.TTL, out.TCPFlags, out.Passed = s.TTL, s.TCPFlags, s.Passed
}

// readRateSamples feeds the data plane's 1-in-N samples (their own ring
// buffer, one reader) to the shield. Without the ring buffer the shield
// learns from the aggregate counters alone.
func (d *Daemon) readRateSamples(ctx context.Context) error {
	r, err := d.m.NewRateSampleReader()
	if err != nil {
		d.log.Warn("shield: no 1-in-N samples; it learns from the aggregate counters alone", "err", err)
		return nil
	}
	go func() {
		<-ctx.Done()
		r.Close()
	}()
	for {
		s, err := r.Read()
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		d.shieldSample(s)
	}
}

// fingerprintRules says whether the data plane has fingerprint rules.
const fingerprintRules = false

// writeFingerprint writes a fingerprint rule.
func (d *Daemon) writeFingerprint(c shield.Change) error { return errNoFingerprints }
