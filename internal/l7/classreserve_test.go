package l7

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// TestReserveOutsideFirstClass: a rule's reserve is the first class's: a
// request outside it (DecideOutsideReserve) is refused once its charge
// would leave the rule under its reserve, and gets a Retry-After that
// brings the reserve and its cost back; a first-class request (Decide)
// uses the reserve to the last unit.
func TestReserveOutsideFirstClass(t *testing.T) {
	clock := new(l7test.ManualClock)
	g, err := NewGCRA(10, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMiddleware(Config{Clock: clock, Rules: []Rule{{Name: "asn", Key: func(*http.Request) (uint64, bool) { return 1, true },
		Algorithm: g, Reserve: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	outside := func() (bool, time.Duration) {
		var p Pending
		m.DecideOutsideReserve(r, &p)
		if p.Allowed() {
			p.Commit()
			return true, 0
		}
		return false, p.out[0].RetryAfter
	}
	for i := 0; i < 5; i++ {
		if ok, _ := outside(); !ok {
			t.Fatalf("outside request %d refused with %d of 10 used", i, i)
		}
	}
	ok, retry := outside()
	if ok {
		t.Fatal("an outside request took the reserve")
	}
	if retry != 100*time.Millisecond {
		t.Errorf("Retry-After %v, want 100ms (one unit at 10/s)", retry)
	}
	for i := 0; i < 5; i++ {
		var p Pending
		m.Decide(r, &p)
		if !p.Allowed() {
			t.Fatalf("first-class request %d refused inside the reserve", i)
		}
		p.Commit()
	}
	var p Pending
	m.Decide(r, &p)
	if p.Allowed() {
		t.Fatal("first-class request admitted past the limit")
	}
	clock.Advance(100 * time.Millisecond)
	if ok, _ := outside(); ok {
		t.Fatal("an outside request admitted with 1 of 10 units back (reserve 5)")
	}
	clock.Advance(500 * time.Millisecond)
	if ok, _ := outside(); !ok {
		t.Fatal("an outside request refused with 6 of 10 units back (reserve 5)")
	}
	if _, err := NewMiddleware(Config{Rules: []Rule{{Name: "x", Key: func(*http.Request) (uint64, bool) { return 1, true },
		Algorithm: g, Reserve: 10}}}); err == nil {
		t.Error("a reserve of the whole limit accepted")
	}
}

// TestTakeAllOutsideReserveIsTheMiddlewares: the rate-limit service's
// TakeAllOutsideReserve and a route's DecideOutsideReserve decide the same
// sequence the same way (one code path): admissions, refusals and
// Retry-After, with a personal limit beside the reserved one.
func TestTakeAllOutsideReserveIsTheMiddlewares(t *testing.T) {
	clock := new(l7test.ManualClock)
	alg := func(n, burst int64) Algorithm {
		g, err := NewGCRA(n, time.Second, burst)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	m, err := NewMiddleware(Config{Clock: clock, Rules: []Rule{
		{Name: "all", Key: func(*http.Request) (uint64, bool) { return 1, true }, Algorithm: alg(10, 10), Reserve: 4},
		{Name: "one", Key: func(*http.Request) (uint64, bool) { return 2, true }, Algorithm: alg(20, 6)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	all, err := NewStore(alg(10, 10), StoreConfig{Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	one, err := NewStore(alg(20, 6), StoreConfig{Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	inReserve := 0
	for step := range 60 {
		first := step%3 == 0 // every third request is the first class's
		var p Pending
		if first {
			m.Decide(r, &p)
		} else {
			m.DecideOutsideReserve(r, &p)
		}
		checks := []Check{{Store: all, Key: 1, N: 1, Reserve: 4}, {Store: one, Key: 2, N: 1}}
		var out [2]Decision
		var c Charges
		var ok bool
		if first {
			ok = TakeAll(clock, checks, out[:], &c)
		} else {
			ok = TakeAllOutsideReserve(clock, checks, out[:], &c)
		}
		if ok != p.Allowed() {
			t.Fatalf("step %d (first %t): middleware %t, TakeAll %t", step, first, p.Allowed(), ok)
		}
		if p.Allowed() {
			p.Commit()
		}
		if !ok && !first && out[0].Remaining > 0 {
			inReserve++
		}
		for i := range out {
			if out[i] != p.out[i] {
				t.Fatalf("step %d limit %d: middleware %+v, TakeAll %+v", step, i, p.out[i], out[i])
			}
		}
		clock.Advance(40 * time.Millisecond)
	}
	if inReserve == 0 {
		t.Fatal("no request was refused inside the reserve")
	}
}
