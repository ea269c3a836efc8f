package loader_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// partsGen is asnGen(0) with an ASN burst of 100 and standing, and a
// validated source in each of AS64500 (198.18.1.7) and AS64501
// (198.19.1.7).
func partsGen(td *testDatapath) {
	td.tb.Helper()
	g := asnGen(0)
	g.Standing = policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: time.Hour}
	td.apply(g)
	for _, ip := range []string{"198.18.1.7", "198.19.1.7"} {
		if err := td.m.SetStanding(netip.MustParseAddr(ip), maps.StandingValidated); err != nil {
			td.tb.Fatal(err)
		}
	}
}

// newSources is how many of 4 new sources × 5 packets pass (prefix is
// "198.18.2" or "198.19.2"; round keeps sources of different rounds
// apart).
func (td *testDatapath) newSources(prefix string, round int) int {
	td.tb.Helper()
	n := 0
	for i := range 4 {
		n += td.burst(fmt.Sprintf("%s.%d", prefix, round*10+i+1), 5)
	}
	return n
}

func (td *testDatapath) onlyOverride(a maps.Aggregate) maps.Override {
	td.tb.Helper()
	list, err := td.m.Overrides()
	if err != nil {
		td.tb.Fatal(err)
	}
	for _, o := range list {
		if o.Aggregate == a {
			return o
		}
	}
	td.tb.Fatalf("no override of %v in %+v", a, list)
	return maps.Override{}
}

// nearExpiry says whether a read-back expiry is want, given that the test clock
// has moved by ahead since want was written (the read-back converts the
// data plane's clock to wall-clock time at the test clock).
func nearExpiry(got, want time.Time, ahead time.Duration) bool {
	return got.Sub(want.Add(-ahead)).Abs() <= time.Millisecond
}

// wantParts checks the origins of an override's parts, budget part first.
func wantParts(t *testing.T, o maps.Override, origins ...maps.Origin) {
	t.Helper()
	if len(o.Parts) != len(origins) {
		t.Fatalf("override %v: parts %+v, want origins %v", o.Aggregate, o.Parts, origins)
	}
	for i, p := range o.Parts {
		if p.Origin != origins[i] {
			t.Fatalf("override %v: parts %+v, want origins %v", o.Aggregate, o.Parts, origins)
		}
	}
}

// TestOverrideShieldThenFleet: the shield's new-source part, then fleet
// mode's share on the same aggregate: both are in force; fleet's next
// write keeps the new-source bucket's state; once the share expires the
// new-source part survives with its own expiry and its bucket state, and
// the policy's budget is back.
func TestOverrideShieldThenFleet(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	partsGen(td)
	a := asnAgg(0, 64500)
	shieldExp := time.Now().Add(time.Hour)
	td.setOverride(maps.Override{Aggregate: a, NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: shieldExp, Origin: maps.OriginShield})
	td.setOverride(maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginFleet})

	o := td.onlyOverride(a)
	wantParts(t, o, maps.OriginFleet, maps.OriginShield)
	if o.Budget.Count != 10 || o.Budget.Burst != 5 || o.Origin != maps.OriginFleet || !nearExpiry(o.Parts[1].Expires, shieldExp, 0) {
		t.Fatalf("both parts read back: %+v", o)
	}
	if got := td.burst("198.18.1.7", 20); got != 5 {
		t.Fatalf("validated source under the fleet share (burst 5): %d of 20 passed", got)
	}
	td.setClock(ovrStart + time.Second) // the share's bucket refills (10/s, burst 5)
	if got := td.newSources("198.18.2", 0); got != 3 {
		t.Fatalf("new sources under the shield's new-source burst of 3: %d of 20 passed", got)
	}

	// Fleet's next interval rewrites its share: the new-source bucket
	// stays empty (1/h).
	td.setOverride(maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginFleet})
	td.setClock(ovrStart + 2*time.Second)
	if got := td.newSources("198.18.2", 1); got != 0 {
		t.Fatalf("new sources after fleet's rewrite: %d of 20 passed, want 0 (the new-source bucket's state kept)", got)
	}
	wantParts(t, td.onlyOverride(a), maps.OriginFleet, maps.OriginShield)

	// The share expires (and its debt is paid): the prune rewrites the
	// shield's part alone, with its own expiry and its bucket.
	td.setClock(ovrStart + 13*time.Second)
	if n, err := td.m.PruneOverrides(); err != nil || n != 0 {
		t.Fatalf("prune after the share's expiry: %d deleted, %v; want 0 (the shield's part survives)", n, err)
	}
	o = td.onlyOverride(a)
	wantParts(t, o, maps.OriginShield)
	if o.Budget.Count != 0 || o.NewBudget.Burst != 3 || !nearExpiry(o.Expires, shieldExp, 13*time.Second) {
		t.Fatalf("after the share's expiry: %+v, want the new-source part alone until %v", o, shieldExp)
	}
	if got := td.burst("198.18.1.7", 150); got != 100 {
		t.Fatalf("validated source after the share's expiry: %d of 150 passed, want the policy's burst of 100", got)
	}
	if got := td.newSources("198.18.2", 2); got != 0 {
		t.Fatalf("new sources after the share's expiry: %d of 20 passed, want 0 (the new-source part, its bucket empty)", got)
	}
	// Deleting the fleet's part (there is none left) changes nothing;
	// deleting the shield's removes the override.
	must(t, td.m.DeleteOverride(a, maps.OriginFleet))
	wantParts(t, td.onlyOverride(a), maps.OriginShield)
	must(t, td.m.DeleteOverride(a, maps.OriginShield))
	if list, err := td.m.Overrides(); err != nil || len(list) != 0 {
		t.Fatalf("after deleting the shield's part: %+v, %v", list, err)
	}
	td.wantGateClear()
}

// TestOverrideFleetThenShield: fleet mode's share, then the shield's
// new-source part: the share stays; deleting the shield's part keeps the
// share (and the gate); a shield part that expires first leaves the share
// with its own expiry; deleting fleet's part keeps the shield's.
func TestOverrideFleetThenShield(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	partsGen(td)
	a := asnAgg(0, 64501)
	fleetExp := time.Now().Add(time.Hour)
	share := maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: fleetExp, Origin: maps.OriginFleet}
	td.setOverride(share)
	td.setOverride(maps.Override{Aggregate: a, NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginShield})
	wantParts(t, td.onlyOverride(a), maps.OriginFleet, maps.OriginShield)
	if got := td.burst("198.19.1.7", 20); got != 5 {
		t.Fatalf("validated source under the fleet share (burst 5) after the shield's write: %d of 20 passed", got)
	}
	td.setClock(ovrStart + time.Second)
	if got := td.newSources("198.19.2", 0); got != 3 {
		t.Fatalf("new sources under the new-source burst of 3: %d of 20 passed", got)
	}

	// The shield ends its action: the share stays.
	must(t, td.m.DeleteOverride(a, maps.OriginShield))
	o := td.onlyOverride(a)
	wantParts(t, o, maps.OriginFleet)
	if o.NewBudget.Burst != 0 || o.Budget.Count != 10 || !nearExpiry(o.Expires, fleetExp, time.Second) {
		t.Fatalf("after deleting the shield's part: %+v", o)
	}
	td.setClock(ovrStart + 2*time.Second)
	if got := td.burst("198.19.1.7", 20); got != 5 {
		t.Fatalf("validated source after deleting the shield's part: %d of 20 passed, want the share's 5", got)
	}

	// A shield part that expires first: the prune leaves the share.
	td.setOverride(maps.Override{Aggregate: a, NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: time.Now().Add(5 * time.Second), Origin: maps.OriginShield})
	td.setClock(ovrStart + 8*time.Second)
	if n, err := td.m.PruneOverrides(); err != nil || n != 0 {
		t.Fatalf("prune after the shield part's expiry: %d deleted, %v; want 0", n, err)
	}
	o = td.onlyOverride(a)
	wantParts(t, o, maps.OriginFleet)
	if !nearExpiry(o.Expires, fleetExp, 8*time.Second) {
		t.Fatalf("the share after the shield part's expiry: %+v, want its own expiry %v", o, fleetExp)
	}
	if got := td.burst("198.19.1.7", 20); got != 5 {
		t.Fatalf("validated source after the shield part's expiry: %d of 20 passed, want the share's 5", got)
	}
	td.setClock(ovrStart + 9*time.Second) // the share's bucket refills
	if got := td.newSources("198.19.2", 1); got != 5 {
		t.Fatalf("new sources after the shield part's expiry: %d of 20 passed, want the share's 5 (refilled), no new-source bucket", got)
	}

	// Both again; deleting fleet's part keeps the shield's.
	td.setOverride(maps.Override{Aggregate: a, NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: time.Now().Add(time.Hour), Origin: maps.OriginShield})
	must(t, td.m.DeleteOverride(a, maps.OriginFleet))
	o = td.onlyOverride(a)
	wantParts(t, o, maps.OriginShield)
	if o.Budget.Count != 0 || o.NewBudget.Burst != 3 {
		t.Fatalf("after deleting fleet's part: %+v", o)
	}
	td.setClock(ovrStart + 10*time.Second)
	if got := td.burst("198.19.1.7", 150); got != 100 {
		t.Fatalf("validated source without the share: %d of 150 passed, want the policy's 100", got)
	}
}

// TestOverridePartsAfterRestart: a process that opens the pins afresh
// reads both parts' origins from the value (their expiry: the value's)
// and deletes the shield's part without the share.
func TestOverridePartsAfterRestart(t *testing.T) {
	requireRoot(t)
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("egdp-ovrparts-%d", os.Getpid()))
	t.Cleanup(func() { loader.Unpin(pinDir) })
	td := openPinnedTestDatapath(t, smallSizes, pinDir)
	td.setClock(ovrStart)
	partsGen(td)
	a := asnAgg(0, 64500)
	td.setOverride(maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: time.Now().Add(time.Hour), Origin: maps.OriginFleet})
	td.setOverride(maps.Override{Aggregate: a, NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: time.Now().Add(time.Hour), Origin: maps.OriginShield})
	td.d.Close()

	td = openPinnedTestDatapath(t, smallSizes, pinDir)
	td.setClock(ovrStart)
	wantParts(t, td.onlyOverride(a), maps.OriginFleet, maps.OriginShield)
	must(t, td.m.DeleteOverride(a, maps.OriginShield))
	o := td.onlyOverride(a)
	wantParts(t, o, maps.OriginFleet)
	if o.Budget.Count != 10 || o.NewBudget.Burst != 0 {
		t.Fatalf("after the restart and deleting the shield's part: %+v", o)
	}
	if got := td.burst("198.18.1.7", 20); got != 5 {
		t.Fatalf("validated source under the share after the restart: %d of 20 passed, want 5", got)
	}
}
