// Package mapstest holds what tests and benchmarks share to drive
// internal/maps directly, without the daemon. It is imported by tests and
// bench/ only (cmd/edgectl does not), and lives outside internal/maps so
// that the tests of every package maps builds on can import it; maps' own
// tests can, from the external package maps_test.
package mapstest

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// StageCommit makes c the live generation: Stage, then Commit.
func StageCommit(m *maps.Maps, c *policy.Compiled) error {
	s, err := m.Generations.Stage(c)
	if err != nil {
		return err
	}
	return m.Generations.Commit(s)
}

// SmallSizes are table sizes that load quickly and hold what the tests'
// policies need.
var SmallSizes = loader.Sizes{MaxRules: 64, SrcEntries: 4096, AggEntries: 4096, PrefixEntries: 4096, ListEntries: 1024, L4Entries: 64}

// Load loads the data plane with opts, not attached (packets go through
// BPF_PROG_TEST_RUN, or the caller attaches it), closes it when tb ends,
// and returns it with its maps. It skips (fails in CI) when not root.
func Load(tb testing.TB, opts loader.Options) (*loader.Datapath, *maps.Maps) {
	tb.Helper()
	testenv.RequireRoot(tb)
	d, err := loader.Load(opts)
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { d.Close() })
	return d, maps.New(d)
}
