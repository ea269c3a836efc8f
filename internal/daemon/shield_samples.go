package daemon

import (
	"fmt"
	"math"
	"time"

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

// fieldMasks maps the shield's fingerprint fields to the data plane's.
var fieldMasks = []struct {
	s shield.FieldMask
	m maps.FieldMask
}{
	{shield.FProto, maps.FieldProto}, {shield.FDPort, maps.FieldDPort}, {shield.FSPort, maps.FieldSPort},
	{shield.FLen, maps.FieldLen}, {shield.FTTL, maps.FieldTTL}, {shield.FTCPFlags, maps.FieldTCPFlags},
	{shield.FSrc, maps.FieldSrc},
}

// writeFingerprint writes (or deletes) a fingerprint rule; its id is the
// action's.
func (st *shieldRun) writeFingerprint(c shield.Change) error {
	a := c.Action
	if c.Op == shield.OpRemove {
		return st.m.Fingerprints.Delete(a.ID)
	}
	f := a.Fingerprint
	if f == nil {
		return fmt.Errorf("shield action %d: no fingerprint", a.ID)
	}
	var mask maps.FieldMask
	for _, fm := range fieldMasks {
		if f.Mask&fm.s != 0 {
			mask |= fm.m
		}
	}
	n := uint64(math.Ceil(a.Budget))
	return st.m.Fingerprints.Set(maps.Fingerprint{ID: a.ID, Mask: mask, Proto: f.Proto, DPort: f.DPort, SPort: f.SPort,
		Len: f.Len, TTL: f.TTL, TCPFlags: f.TCPFlags, Src: f.Src,
		Budget: maps.Rate{Count: n, Per: time.Second, Burst: max(n, 1)}, Expires: a.Expires, Origin: maps.OriginShield})
}
