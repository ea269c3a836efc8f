package loader_test

import (
	"fmt"
	"sort"
	"testing"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// counted is which aggregate instances the data plane counts now, after one
// packet from each of the ASN facts' sources (198.18/16: AS64500,
// 198.19/16: AS64501).
func (td *testDatapath) counted() []string {
	td.tb.Helper()
	td.burst("198.18.1.1", 1)
	td.burst("198.19.1.1", 1)
	cs, err := td.m.Overrides.AggregateCounters()
	if err != nil {
		td.tb.Fatal(err)
	}
	var out []string
	for _, c := range cs {
		out = append(out, c.Aggregate.String())
	}
	sort.Strings(out)
	return out
}

// TestWatchOwners: a watch held by the shield and by fleet mode stays until
// both let it go, in either order; an owner letting go of what it never
// held, or twice, changes nothing; a policy swap without the rule drops the
// watch for every owner (WatchedBy says so), and the rule coming back is
// not counted until an owner watches it again.
func TestWatchOwners(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(asnGen(7))
	asn7 := maps.Watch{RuleID: 7, Kind: maps.AggKindASN}
	both := "[rule 7 asn 64500 rule 7 asn 64501]"
	for _, order := range [][2]maps.Origin{{maps.OriginShield, maps.OriginFleet}, {maps.OriginFleet, maps.OriginShield}} {
		first, second := order[0], order[1]
		must(t, td.m.Overrides.Watch(7, maps.AggKindASN, first))
		must(t, td.m.Overrides.Watch(7, maps.AggKindASN, second))
		must(t, td.m.Overrides.Watch(7, maps.AggKindASN, second)) // again: a no-op
		if got := fmt.Sprint(td.counted()); got != both {
			t.Fatalf("watched by both: counted %s, want %s", got, both)
		}
		must(t, td.m.Overrides.Unwatch(7, maps.AggKindASN, first))
		must(t, td.m.Overrides.Unwatch(7, maps.AggKindASN, first)) // twice: a no-op
		if got := fmt.Sprint(td.counted()); got != both {
			t.Fatalf("owner %d let go, owner %d holds it: counted %s, want %s", first, second, got, both)
		}
		if !td.m.Overrides.WatchedBy(second)[asn7] || td.m.Overrides.WatchedBy(first)[asn7] {
			t.Fatalf("WatchedBy after owner %d let go: %d: %v, %d: %v", first, first, td.m.Overrides.WatchedBy(first), second, td.m.Overrides.WatchedBy(second))
		}
		must(t, td.m.Overrides.Unwatch(7, maps.AggKindASN, second))
		if got := td.counted(); len(got) != 0 {
			t.Fatalf("both let go: still counted %v", got)
		}
		td.wantGateClear()
	}

	// A policy swap that removes rule 7 drops its watch, whoever held it.
	must(t, td.m.Overrides.Watch(7, maps.AggKindASN, maps.OriginShield))
	must(t, td.m.Overrides.Watch(7, maps.AggKindASN, maps.OriginFleet))
	must(t, td.m.Overrides.Watch(0, maps.AggKindGlobal, maps.OriginFleet))
	td.apply(asnGen(8))
	if w := td.m.Overrides.WatchedBy(maps.OriginShield); len(w) != 0 {
		t.Fatalf("the shield still watches %v after rule 7 left", w)
	}
	if w := td.m.Overrides.WatchedBy(maps.OriginFleet); fmt.Sprint(w) != fmt.Sprint(map[maps.Watch]bool{{Kind: maps.AggKindGlobal}: true}) {
		t.Fatalf("fleet watches %v after rule 7 left, want the global bucket alone", w)
	}
	if got := fmt.Sprint(td.counted()); got != "[global]" {
		t.Fatalf("after rule 7 left: counted %s, want [global]", got)
	}
	must(t, td.m.Overrides.Unwatch(0, maps.AggKindGlobal, maps.OriginFleet))
	td.apply(asnGen(7))
	if got := td.counted(); len(got) != 0 {
		t.Fatalf("rule 7 came back unwatched: counted %v", got)
	}
	td.wantGateClear()
	must(t, td.m.Overrides.Watch(7, maps.AggKindASN, maps.OriginFleet))
	if got := fmt.Sprint(td.counted()); got != both {
		t.Fatalf("watched again: counted %s, want %s", got, both)
	}
}
