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
		if err := td.m.Standing.Set(netip.MustParseAddr(ip), maps.StandingValidated); err != nil {
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
	list, err := td.m.Overrides.All()
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
// data plane's clock to wall-clock time at the test clock, so the wall
// time the test took in between is in it too: a few ms on a busy machine).
func nearExpiry(got, want time.Time, ahead time.Duration) bool {
	return got.Sub(want.Add(-ahead)).Abs() <= 100*time.Millisecond
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
	if n, err := td.m.Overrides.Prune(); err != nil || n != 0 {
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
	must(t, td.m.Overrides.Delete(a, maps.OriginFleet))
	wantParts(t, td.onlyOverride(a), maps.OriginShield)
	must(t, td.m.Overrides.Delete(a, maps.OriginShield))
	if list, err := td.m.Overrides.All(); err != nil || len(list) != 0 {
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
	must(t, td.m.Overrides.Delete(a, maps.OriginShield))
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
	if n, err := td.m.Overrides.Prune(); err != nil || n != 0 {
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
	must(t, td.m.Overrides.Delete(a, maps.OriginFleet))
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
// reads both parts' origins and expiries from the value and deletes the
// shield's part without the share.
func TestOverridePartsAfterRestart(t *testing.T) {
	requireRoot(t)
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("egdp-ovrparts-%d", os.Getpid()))
	t.Cleanup(func() { loader.Unpin(pinDir) })
	td := openPinnedTestDatapath(t, smallSizes, pinDir)
	td.setClock(ovrStart)
	partsGen(td)
	a := asnAgg(0, 64500)
	fleetExp, shieldExp := time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
	td.setOverride(maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: fleetExp, Origin: maps.OriginFleet})
	td.setOverride(maps.Override{Aggregate: a, NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: shieldExp, Origin: maps.OriginShield})
	td.d.Close()

	td = openPinnedTestDatapath(t, smallSizes, pinDir)
	td.setClock(ovrStart)
	o := td.onlyOverride(a)
	wantParts(t, o, maps.OriginFleet, maps.OriginShield)
	// The test clock stood still while the wall clock moved on (between
	// the two writes, and the reopen): the read-back is later by that
	// much, an hour apart give or take the time between the writes (3 ms
	// on 6.12 under TCG: 100 ms, as nearExpiry).
	if d := o.Parts[1].Expires.Sub(o.Parts[0].Expires) - time.Hour; d.Abs() > 100*time.Millisecond ||
		o.Parts[0].Expires.Before(fleetExp) || o.Parts[0].Expires.After(fleetExp.Add(time.Minute)) {
		t.Fatalf("after the restart: parts %+v, want expiries %v and %v", o.Parts, fleetExp, shieldExp)
	}
	must(t, td.m.Overrides.Delete(a, maps.OriginShield))
	o = td.onlyOverride(a)
	wantParts(t, o, maps.OriginFleet)
	if o.Budget.Count != 10 || o.NewBudget.Burst != 0 {
		t.Fatalf("after the restart and deleting the shield's part: %+v", o)
	}
	if got := td.burst("198.18.1.7", 20); got != 5 {
		t.Fatalf("validated source under the share after the restart: %d of 20 passed, want 5", got)
	}
}

// rawOverride is the value the program holds for the ASN aggregate a.
func (td *testDatapath) rawOverride(a maps.Aggregate) (loader.LimiterEgOverride, bool) {
	td.tb.Helper()
	var v loader.LimiterEgOverride
	k := loader.LimiterEgAggKey{RuleId: a.RuleID, Kind: uint8(a.Kind), Asn: a.ASN}
	if err := td.d.Objects.Overrides.Lookup(k, &v); err != nil {
		return v, false
	}
	return v, true
}

// TestOverridePartsExpireApart: fleet mode's share and the shield's
// new-source part, written with different expiries, each apply until
// their own expiry with no write or prune in between: the share first
// (the new-source part still applies, the budget is the policy's), then
// the reverse order (the share still applies, new sources are charged by
// it alone). The prune clears the expired part and deletes the entry
// only when both parts have expired.
func TestOverridePartsExpireApart(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	partsGen(td)
	newPart := maps.Rate{Count: 1, Per: time.Hour, Burst: 3}

	t.Run("budget first", func(t *testing.T) {
		a := asnAgg(0, 64500)
		shieldExp := time.Now().Add(time.Hour)
		td.setOverride(maps.Override{Aggregate: a, NewBudget: newPart, Expires: shieldExp, Origin: maps.OriginShield})
		td.setOverride(maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginFleet})
		if got := td.burst("198.18.1.7", 20); got != 5 {
			t.Fatalf("validated source before either expiry: %d of 20 passed, want the share's burst of 5", got)
		}
		td.setClock(ovrStart + time.Second) // the share's bucket refills (10/s, burst 5)
		if got := td.newSources("198.18.2", 0); got != 3 {
			t.Fatalf("new sources before either expiry: %d of 20 passed, want the new-source burst of 3", got)
		}

		// The share has expired; nothing rewrote the value.
		td.setClock(ovrStart + 13*time.Second)
		if v, ok := td.rawOverride(a); !ok || v.Expires == 0 || v.NewExpires == 0 || v.Expires >= v.NewExpires {
			t.Fatalf("value after the share's expiry, before any prune: %+v (present %v), want both parts, the share's expiring first", v, ok)
		}
		o := td.onlyOverride(a)
		wantParts(t, o, maps.OriginShield)
		if o.Budget.Count != 0 || !nearExpiry(o.Expires, shieldExp, 13*time.Second) {
			t.Fatalf("read back after the share's expiry: %+v, want the new-source part alone", o)
		}
		if got := td.newSources("198.18.2", 1); got != 0 {
			t.Fatalf("new sources after the share's expiry: %d of 20 passed, want 0 (the new-source part, its bucket empty)", got)
		}
		if got := td.burst("198.18.1.7", 150); got != 100 {
			t.Fatalf("validated source after the share's expiry: %d of 150 passed, want the policy's burst of 100", got)
		}
		if n, err := td.m.Overrides.Prune(); err != nil || n != 0 {
			t.Fatalf("prune after the share's expiry: %d deleted, %v; want 0", n, err)
		}
		if v, ok := td.rawOverride(a); !ok || v.Expires != 0 || v.Budget != (loader.LimiterEgBucketCfg{}) || v.NewExpires == 0 {
			t.Fatalf("value after the prune: %+v (present %v), want the new-source part alone", v, ok)
		}
		must(t, td.m.Overrides.Delete(a, maps.OriginShield))
	})

	t.Run("new-source part first", func(t *testing.T) {
		a := asnAgg(0, 64501)
		td.setClock(ovrStart + 20*time.Second)
		fleetExp := time.Now().Add(time.Minute)
		td.setOverride(maps.Override{Aggregate: a, Budget: rate(10, 5), Expires: fleetExp, Origin: maps.OriginFleet})
		td.setOverride(maps.Override{Aggregate: a, NewBudget: newPart, Expires: time.Now().Add(5 * time.Second), Origin: maps.OriginShield})
		if got := td.burst("198.19.1.7", 20); got != 5 {
			t.Fatalf("validated source before either expiry: %d of 20 passed, want the share's burst of 5", got)
		}
		td.setClock(ovrStart + 21*time.Second)
		if got := td.newSources("198.19.2", 0); got != 3 {
			t.Fatalf("new sources before either expiry: %d of 20 passed, want the new-source burst of 3", got)
		}

		// The new-source part has expired; nothing rewrote the value.
		td.setClock(ovrStart + 28*time.Second)
		o := td.onlyOverride(a)
		wantParts(t, o, maps.OriginFleet)
		if o.NewBudget.Count != 0 || o.Budget.Count != 10 || !nearExpiry(o.Expires, fleetExp, 8*time.Second) {
			t.Fatalf("read back after the new-source part's expiry: %+v, want the share alone", o)
		}
		if got := td.newSources("198.19.2", 1); got != 5 {
			t.Fatalf("new sources after the new-source part's expiry: %d of 20 passed, want the share's burst of 5", got)
		}
		td.setClock(ovrStart + 29*time.Second) // the share's bucket refills
		if got := td.burst("198.19.1.7", 20); got != 5 {
			t.Fatalf("validated source after the new-source part's expiry: %d of 20 passed, want the share's 5", got)
		}
		if n, err := td.m.Overrides.Prune(); err != nil || n != 0 {
			t.Fatalf("prune after the new-source part's expiry: %d deleted, %v; want 0", n, err)
		}
		if v, ok := td.rawOverride(a); !ok || v.NewExpires != 0 || v.NewBudget != (loader.LimiterEgBucketCfg{}) || v.Expires == 0 {
			t.Fatalf("value after the prune: %+v (present %v), want the share alone", v, ok)
		}

		// Both expired: the prune deletes the entry.
		td.setClock(ovrStart + 90*time.Second)
		if got := td.burst("198.19.1.7", 150); got != 100 {
			t.Fatalf("validated source after both expiries: %d of 150 passed, want the policy's 100", got)
		}
		if n, err := td.m.Overrides.Prune(); err != nil || n != 1 {
			t.Fatalf("prune after both expiries: %d deleted, %v; want 1", n, err)
		}
		if _, ok := td.rawOverride(a); ok {
			t.Fatal("override still present after both parts expired and the prune")
		}
		td.wantGateClear()
	})
}
