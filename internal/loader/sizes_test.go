package loader_test

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// The object as compiled (the C headers' #ifndef fallbacks) is the object
// the loader makes for a policy without a tables: section: Spec with the
// default sizes changes no map's size and no size constant. With
// TestDefaultTablesAreTheObjectsFallbacks (internal/policy) this holds the
// C fallbacks to the one default table, policy.DefaultTables.
func TestDefaultSizesAreTheObjects(t *testing.T) {
	raw, err := loader.LoadLimiter()
	if err != nil {
		t.Fatal(err)
	}
	sized, err := loader.Spec(loader.DefaultSizes(), false)
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range raw.Maps {
		got := sized.Maps[name]
		if got.MaxEntries != m.MaxEntries {
			t.Errorf("map %s: %d entries in the object, %d at the default sizes", name, m.MaxEntries, got.MaxEntries)
		}
		if m.InnerMap != nil && got.InnerMap.MaxEntries != m.InnerMap.MaxEntries {
			t.Errorf("map %s's inner map: %d entries in the object, %d at the default sizes", name, m.InnerMap.MaxEntries, got.InnerMap.MaxEntries)
		}
	}
	for _, v := range []string{"eg_seen_mask", "eg_max_rules"} {
		var want, got uint32
		if err := raw.Variables[v].Get(&want); err != nil {
			t.Fatal(err)
		}
		if err := sized.Variables[v].Get(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: %d in the object, %d at the default sizes", v, want, got)
		}
	}
	if got, want := loader.DefaultSizes().L4Entries, uint32(loader.LimiterEgTableDefaultsEG_TBL_L4ENTRIES); got != want {
		t.Errorf("default L4 entries %d, the C's %d", got, want)
	}
}
