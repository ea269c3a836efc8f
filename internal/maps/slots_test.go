package maps

import (
	"maps"
	"slices"
	"testing"

	"github.com/edgeguard/edgeguard/internal/policy"
)

func TestAssignSlots(t *testing.T) {
	rules := func(ids ...uint32) []policy.CompiledRule {
		var out []policy.CompiledRule
		for _, id := range ids {
			out = append(out, policy.CompiledRule{ID: id})
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		rules     []policy.CompiledRule
		old       map[uint32]uint32
		want      map[uint32]uint32
		wantFresh []uint32
	}{
		{"small ids take their own slot", rules(0, 1, 5), nil,
			map[uint32]uint32{0: 0, 1: 1, 5: 5}, []uint32{0, 1, 5}},
		{"hashed ids take the first free slots", rules(0, 4000781694, 99999), nil,
			map[uint32]uint32{0: 0, 4000781694: 1, 99999: 2}, []uint32{0, 1, 2}},
		{"surviving ids keep their slot", rules(0, 99999, 777777), map[uint32]uint32{0: 0, 4000781694: 1, 99999: 2},
			map[uint32]uint32{0: 0, 99999: 2, 777777: 1}, []uint32{1}},
		{"no default rule keeps slot 0 free", rules(12345678), nil,
			map[uint32]uint32{12345678: 1}, []uint32{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, fresh, err := assignSlots(tc.rules, tc.old, 8)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("slots = %v, want %v", got, tc.want)
			}
			slices.Sort(fresh)
			if !slices.Equal(fresh, tc.wantFresh) {
				t.Errorf("fresh = %v, want %v", fresh, tc.wantFresh)
			}
		})
	}
	if _, _, err := assignSlots(rules(1, 2, 3), nil, 2); err == nil {
		t.Error("3 rules in a 2-slot table: want an error")
	}
	if _, _, err := assignSlots(rules(1, 1), nil, 8); err == nil {
		t.Error("duplicate id: want an error")
	}
}
