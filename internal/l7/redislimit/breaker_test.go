package redislimit

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"strings"
	"testing"
	"time"
)

func TestBreakerTimeline(t *testing.T) {
	clock := &l7test.ManualClock{}
	var log []string
	b := newBreaker(BreakerConfig{Failures: 3, OpenFor: 100 * time.Millisecond, MaxOpenFor: 300 * time.Millisecond}, clock,
		func(from, to BreakerState) { log = append(log, from.String()+">"+to.String()) })
	expect := func(step string, wantOK, wantProbe bool, wantState BreakerState) {
		t.Helper()
		ok, probe := b.allow()
		if ok != wantOK || probe != wantProbe || b.State() != wantState {
			t.Fatalf("%s: allow()=%v,%v state %s; want %v,%v %s", step, ok, probe, b.State(), wantOK, wantProbe, wantState)
		}
	}
	b.failure()
	b.failure()
	b.success() // resets the run of failures
	b.failure()
	b.failure()
	expect("2 consecutive failures", true, false, BreakerClosed)
	b.failure()
	expect("3 consecutive failures", false, false, BreakerOpen)
	clock.Advance(100*time.Millisecond - 1)
	expect("1ns before the probe", false, false, BreakerOpen)
	clock.Advance(1)
	expect("open period over: this caller probes", false, true, BreakerHalfOpen)
	expect("probe in flight: no second probe", false, false, BreakerHalfOpen)
	b.success() // a late round trip from before does not close it
	expect("late success ignored", false, false, BreakerHalfOpen)
	for _, want := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond} {
		b.probeDone(false)
		if got := b.retryIn(); got != want {
			t.Fatalf("after failed probe: open for %s, want %s (doubling, capped)", got, want)
		}
		clock.Advance(want)
		expect("next probe", false, true, BreakerHalfOpen)
	}
	b.probeDone(true)
	expect("probe succeeded", true, false, BreakerClosed)
	b.failure()
	b.failure()
	b.failure()
	if got := b.retryIn(); got != 100*time.Millisecond {
		t.Fatalf("reopened for %s, want the initial 100ms after a recovery", got)
	}
	want := "closed>open open>half_open half_open>open open>half_open half_open>open open>half_open half_open>open open>half_open half_open>closed closed>open"
	if got := strings.Join(log, " "); got != want {
		t.Fatalf("transitions\n got %s\nwant %s", got, want)
	}
}
