package redislimit

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func countAdmitted(t *testing.T, l *Limiter, key string, tries int) int {
	t.Helper()
	n := 0
	for range tries {
		if allow(t, l, key).Decision.Allowed {
			n++
		}
	}
	return n
}

// TestRefundGivesBackRedisCharge: admitted requests refunded through the
// refund script leave both algorithms' Redis state as if they never came.
func TestRefundGivesBackRedisCharge(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{Rules: []Rule{
		{Name: "g", Algorithm: GCRA, Limit: 3, Window: time.Minute},
		{Name: "s", Algorithm: SlidingWindow, Limit: 3, Window: time.Minute},
	}})
	for i := range 10 {
		res := allow(t, l, "k")
		if !res.Decision.Allowed {
			t.Fatalf("request %d refused: the refunds did not give the quota back: %+v", i, res)
		}
		f.advance(time.Millisecond)
		if err := l.Refund(res); err != nil {
			t.Fatalf("Refund: %v", err)
		}
		if err := l.Refund(res); err != nil {
			t.Fatalf("second Refund: %v", err)
		}
	}
	if n := countAdmitted(t, l, "k", 5); n != 3 {
		t.Fatalf("after 10 refunded requests %d of 5 admitted, want the full 3", n)
	}
}

// TestRefundAfterAnotherRefund: a GCRA charge whose key saw another refund
// since it was taken stays charged (its before/after are stale, giving it
// back could over-admit); sliding-window counts are given back anyway.
func TestRefundAfterAnotherRefund(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{Rules: []Rule{{Name: "g", Algorithm: GCRA, Limit: 3, Window: time.Minute}}})
	a, b := allow(t, l, "k"), allow(t, l, "k")
	if !a.Decision.Allowed || !b.Decision.Allowed {
		t.Fatal("first two requests refused")
	}
	if err := l.Refund(a); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(b); err != nil {
		t.Fatal(err)
	}
	if n := countAdmitted(t, l, "k", 5); n != 2 {
		t.Fatalf("%d admitted, want 2: a given back, b kept (a refund came between its charge and its refund)", n)
	}

	s := f.limiter(t, Config{Prefix: "eg:swc:", Registerer: prometheus.NewRegistry(), Rules: []Rule{{Name: "s", Algorithm: SlidingWindow, Limit: 3, Window: time.Minute}}})
	a, b = allow(t, s, "k"), allow(t, s, "k")
	for _, r := range []Result{a, b} {
		if err := s.Refund(r); err != nil {
			t.Fatal(err)
		}
	}
	if n := countAdmitted(t, s, "k", 5); n != 3 {
		t.Fatalf("sliding window: %d admitted, want 3: counts are given back in any order", n)
	}
}

// TestRefundDegradedLocalCharge: with Redis down, a Degrade rule's local
// charge is given back too.
func TestRefundDegradedLocalCharge(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{Rules: []Rule{{Name: "d", Algorithm: GCRA, Limit: 2, Window: time.Minute, Failure: Degrade, DegradeShards: 1}}})
	f.srv.Stop()
	for i := range 5 {
		res := allow(t, l, "k")
		if !res.Decision.Allowed || res.Rules[0].Source != SourceLocal {
			t.Fatalf("request %d: %+v, want admitted by the local limit", i, res)
		}
		f.advance(time.Millisecond)
		if err := l.Refund(res); err != nil {
			t.Fatalf("Refund of a local charge: %v", err)
		}
	}
	if n := countAdmitted(t, l, "k", 4); n != 2 {
		t.Fatalf("%d admitted, want 2 (the local limit's full quota)", n)
	}
}
