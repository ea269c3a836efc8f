package policy

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/bpfsizes"
)

// The compiled objects' own sizes (the C headers' #ifndef fallbacks,
// through enum eg_table_defaults and bpfsizes) are DefaultTables: a program
// loaded without sizes behaves as a policy without a tables: section.
func TestDefaultTablesAreTheObjectsFallbacks(t *testing.T) {
	d := DefaultTables()
	for _, c := range []struct {
		field    string
		policy   uint32
		fallback uint32
	}{
		{"max_rules", d.MaxRules, bpfsizes.MaxRules},
		{"per_source_entries", d.PerSourceEntries, bpfsizes.SrcEntries},
		{"aggregate_entries", d.AggregateEntries, bpfsizes.AggEntries},
		{"prefix_entries", d.PrefixEntries, bpfsizes.PrefixEntries},
		{"list_entries", d.ListEntries, bpfsizes.ListEntries},
		{"ipv4_direct_chunks", d.IPv4DirectChunks, bpfsizes.V4Chunks},
		{"standing_entries", d.StandingEntries, bpfsizes.StandingEntries},
	} {
		if c.policy != c.fallback {
			t.Errorf("tables.%s defaults to %d in DefaultTables but %d in bpf/headers/edgeguard_maps.h; "+
				"change the C fallback and run make generate", c.field, c.policy, c.fallback)
		}
	}
}
