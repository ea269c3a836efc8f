package testenv

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds and fails tb, naming what it waited
// for, when it does not within 30s. The 30s only guard against a hang (a
// condition that never comes); nothing waited for here is a measure of
// speed (for one that is, WaitWithin).
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	WaitWithin(tb, 30*time.Second, what, cond)
}

// WaitWithin polls cond until it holds and returns how long that took; it
// fails tb, naming what it waited for, when cond does not hold within d.
// It polls every millisecond at first, then less often, up to every 20ms:
// a condition that comes at once is seen at once, the time it returns is
// at most 20ms late, and a slow probe (a control-socket round trip, a
// scrape, a birdc) is not run in a tight loop.
func WaitWithin(tb testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	pause := time.Millisecond
	for !cond() {
		if time.Since(start) > d {
			tb.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
	return time.Since(start)
}
