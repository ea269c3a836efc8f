package daemon

import (
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// sampleWeight is how many packets a sample stands for; drop-budget
// samples stand for no rate.
func sampleWeight(s maps.Sample) (float64, bool) { return 0, false }

// sampleFields copies the header fields only 1-in-N samples carry.
func sampleFields(out *shield.Sample, s maps.Sample) {}

// fingerprintRules says whether the data plane has fingerprint rules.
const fingerprintRules = false

// writeFingerprint writes a fingerprint rule.
func (d *Daemon) writeFingerprint(c shield.Change) error { return errNoFingerprints }
