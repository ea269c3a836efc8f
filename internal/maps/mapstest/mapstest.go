// Package mapstest holds what tests and benchmarks share to drive
// internal/maps directly, without the daemon. It is imported by tests and
// bench/ only (cmd/edgectl does not), and lives outside internal/maps so
// that the tests of every package maps builds on can import it; maps' own
// tests can, from the external package maps_test.
package mapstest

import (
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// StageCommit makes c the live generation: Stage, then Commit.
func StageCommit(m *maps.Maps, c *policy.Compiled) error {
	s, err := m.Stage(c)
	if err != nil {
		return err
	}
	return m.Commit(s)
}
