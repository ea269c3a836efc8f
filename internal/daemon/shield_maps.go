package daemon

import (
	"errors"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// toShieldSample resolves a ring-buffer sample for the shield.
// TEMPORARY until dp's 1-in-N samples are merged.
func toShieldSample(s maps.Sample, slotToID map[uint32]uint32, table *asn.Table) (shield.Sample, bool) {
	return shield.Sample{}, false
}

// writeShieldChange writes an enforced change to the data plane.
// TEMPORARY until dp's overrides are merged.
func (d *Daemon) writeShieldChange(c shield.Change) error {
	return errors.New("no override map yet")
}
