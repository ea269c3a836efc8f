package class

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() int64              { return c.ns.Load() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// fakeStandings is the data plane's answer per address, with a count of
// reads: the thing under test is the table, not the data plane.
type fakeStandings struct {
	m     map[netip.Addr]Standing
	reads int
}

func (f *fakeStandings) Standing(a netip.Addr) (Standing, error) {
	f.reads++
	return f.m[a], nil
}

var testCfg = Config{EstablishedAfter: 4 * time.Second, Window: 10 * time.Second, Headroom: 2,
	DefaultUsualRate: 10, CacheTTL: time.Second}

func addr(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}) }

func TestNewClientEarnsHistory(t *testing.T) {
	clk := &fakeClock{}
	tb := NewTable(64, nil, clk, testCfg)
	a := addr(1)
	for i := 0; i < 4; i++ {
		if c := tb.Classify(a, true).Class; c != New {
			t.Fatalf("request %d at %v: %s, want new", i, time.Duration(clk.Now()), c)
		}
		clk.advance(time.Second)
	}
	if c := tb.Classify(a, true).Class; c != Established {
		t.Fatalf("after established_after of clean requests: %s, want established", c)
	}
}

func TestRefusalAndGapRestartHistory(t *testing.T) {
	clk := &fakeClock{}
	tb := NewTable(64, nil, clk, testCfg)
	a := addr(1)
	for i := 0; i < 3; i++ {
		tb.Done(tb.Classify(a, true), false)
		clk.advance(time.Second)
	}
	tb.Done(tb.Classify(a, true), true) // refused at 3 s: starts over
	clk.advance(3 * time.Second)
	if c := tb.Classify(a, true).Class; c != New {
		t.Fatalf("3 s after a refusal: %s, want new", c)
	}
	clk.advance(time.Second)
	if c := tb.Classify(a, true).Class; c != Established {
		t.Fatalf("4 s after a refusal: %s, want established", c)
	}
	// A gap longer than established_after restarts a client without
	// history; one with history keeps it.
	b := addr(2)
	tb.Classify(b, true)
	clk.advance(5 * time.Second)
	tb.Classify(b, true)
	clk.advance(3 * time.Second)
	if c := tb.Classify(b, true).Class; c != New {
		t.Fatalf("after a 5 s gap and 3 s: %s, want new", c)
	}
	clk.advance(10 * time.Second)
	if c := tb.Classify(a, true).Class; c != Established {
		t.Fatalf("established client after a 13 s gap: %s, want established", c)
	}
	// Refusals of a client with history do not take it away.
	tb.Done(tb.Classify(a, true), true)
	if c := tb.Classify(a, true).Class; c != Established {
		t.Fatalf("established client after a refusal: %s", c)
	}
}

func TestDataPlaneStandingThroughCache(t *testing.T) {
	clk := &fakeClock{}
	src := &fakeStandings{m: map[netip.Addr]Standing{
		addr(1): StandingEstablished, addr(2): StandingAuthenticated, addr(3): StandingPenalised, addr(4): StandingNone,
	}}
	tb := NewTable(64, src, clk, testCfg)
	for a, want := range map[netip.Addr]Class{addr(1): Established, addr(2): Authenticated, addr(3): Penalised, addr(4): New} {
		if c := tb.Classify(a, true).Class; c != want {
			t.Errorf("%s: %s, want %s", a, c, want)
		}
	}
	src.reads = 0
	for i := 0; i < 9; i++ {
		tb.Classify(addr(1), true)
		clk.advance(100 * time.Millisecond)
	}
	if src.reads != 0 {
		t.Errorf("%d reads within the TTL, want 0", src.reads)
	}
	clk.advance(100 * time.Millisecond)
	tb.Classify(addr(1), true)
	if src.reads != 1 {
		t.Errorf("%d reads after the TTL, want 1", src.reads)
	}
	// A penalty shows at the next read.
	src.m[addr(1)] = StandingPenalised
	clk.advance(time.Second)
	if c := tb.Classify(addr(1), true).Class; c != Penalised {
		t.Errorf("penalised after the TTL: %s", c)
	}
	// A client named by a forwarding header has no data plane standing.
	src.reads = 0
	if c := tb.Classify(addr(2), false).Class; c != New || src.reads != 0 {
		t.Errorf("forwarded client: %s with %d reads, want new and none", c, src.reads)
	}
	// IPv6: one /64 is one client.
	x, y := netip.MustParseAddr("fd00::1:1"), netip.MustParseAddr("fd00::2:2")
	src.m[Key(x)] = StandingEstablished
	if c := tb.Classify(y, true).Class; c != Established {
		t.Errorf("another address of an established /64: %s", c)
	}
}

// TestRefusedNewNeedsOwnHistory: a client the stage refused while it
// ranked new is not ranked established by the data plane's standing alone
// (which its packets can earn while its requests are shed) until it has
// history at L7; a client with the data plane's standing that was never
// refused as new keeps it.
func TestRefusedNewNeedsOwnHistory(t *testing.T) {
	clk := &fakeClock{}
	src := &fakeStandings{m: map[netip.Addr]Standing{addr(2): StandingEstablished}}
	tb := NewTable(64, src, clk, testCfg)
	bot, user := addr(1), addr(2)
	tb.Done(tb.Classify(bot, true), true) // shed while new
	src.m[bot] = StandingEstablished      // its packets earned the data plane's history
	clk.advance(time.Second + time.Millisecond)
	if c := tb.Classify(bot, true).Class; c != New {
		t.Fatalf("bot refused as new, then established at the data plane: %s, want new", c)
	}
	if c := tb.Classify(user, true).Class; c != Established {
		t.Fatalf("user established at the data plane, never refused: %s, want established", c)
	}
	// An established client's refusal (over its capacity share) does not
	// take the data plane's standing away.
	tb.Done(tb.Classify(user, true), true)
	if c := tb.Classify(user, true).Class; c != Established {
		t.Fatalf("user after a refusal as established: %s, want established", c)
	}
	// The bot earns history of its own: established_after without refusal.
	clk.advance(testCfg.EstablishedAfter)
	if c := tb.Classify(bot, true).Class; c != Established {
		t.Fatalf("bot after established_after without refusal: %s, want established", c)
	}
}

// TestUsualRate: a client with history keeps its class up to Headroom ×
// its usual requests per window, bursts included; beyond that its
// requests are over usual; the usual follows a slow ramp.
func TestUsualRate(t *testing.T) {
	clk := &fakeClock{}
	src := &fakeStandings{m: map[netip.Addr]Standing{addr(1): StandingEstablished}}
	tb := NewTable(64, src, clk, testCfg)
	a := addr(1)
	window := func(n int) (over int) {
		// n requests in clumps of 3 spread over one whole window.
		w := int64(testCfg.Window)
		start := (clk.Now()/w + 1) * w
		clumps := (n + 2) / 3
		sent := 0
		for c := 0; sent < n; c++ {
			clk.ns.Store(start + int64(c)*w/int64(clumps))
			for j := 0; j < 3 && sent < n; j++ {
				if tb.Classify(a, true).Class == OverUsual {
					over++
				}
				sent++
			}
		}
		return over
	}
	// Before a usual is learned: the default, 10/s × 10 s.
	if over := window(130); over != 130-100 {
		t.Fatalf("first window, 130 requests against the default 100: %d over", over)
	}
	a = addr(5)
	src.m[a] = StandingEstablished
	for i := 0; i < 3; i++ {
		if over := window(60); over != 0 {
			t.Fatalf("window %d at its usual: %d over", i, over)
		}
	}
	// usual is now 60 and its clump 6 (two clumps of 3 in a second):
	// 2×60+6 per window keep the class, a jump to 300 does not.
	if over := window(300); over != 300-126 {
		t.Fatalf("a jump to 300: %d over, want %d", over, 300-126)
	}
	// The jump raised the usual by an eighth and one (60 → 68), the
	// clump by one (6 → 7).
	if over := window(200); over != 200-143 {
		t.Fatalf("the window after the jump: %d over, want %d", over, 200-143)
	}
	// A slow ramp (+10% a window) is followed.
	n := 60
	for i := 0; i < 15; i++ {
		n += n / 10
		if over := window(n); over != 0 {
			t.Fatalf("ramp window %d (%d requests): %d over", i, n, over)
		}
	}
}

// TestFloodKeepsClientsWithHistory: a flood of new addresses through a
// small table never pushes out an active client with history.
func TestFloodKeepsClientsWithHistory(t *testing.T) {
	clk := &fakeClock{}
	tb := NewTable(16, nil, clk, testCfg)
	var users []netip.Addr
	for i := 0; i < 8; i++ {
		users = append(users, addr(i))
	}
	for s := 0; s < 5; s++ {
		for _, u := range users {
			tb.Classify(u, true)
		}
		clk.advance(time.Second)
	}
	// The table's hash seed is random: more than 4 of the 8 users may fall
	// in one set of 4 ways, and the one left out never had history. The
	// claim is about those that have it.
	kept := users[:0]
	for _, u := range users {
		if tb.Explain(u, true).History {
			kept = append(kept, u)
		}
	}
	if len(kept) < 4 {
		t.Fatalf("only %d of 8 users kept history before the flood", len(kept))
	}
	users = kept
	for i := 0; i < 10000; i++ {
		tb.Classify(addr(1000+i), true)
		if i%1000 == 0 {
			clk.advance(500 * time.Millisecond)
			for _, u := range users {
				if c := tb.Classify(u, true).Class; c != Established {
					t.Fatalf("user %s after %d flood addresses: %s", u, i, c)
				}
			}
		}
	}
	t.Logf("flood requests the table had no room for: %d", tb.Counts().Untracked)
}

func TestCounts(t *testing.T) {
	tb := NewTable(64, nil, &fakeClock{}, testCfg)
	tb.Done(tb.Classify(addr(1), true), false)
	tb.Done(tb.Classify(addr(2), true), true)
	c := tb.Counts()
	if c.Admitted[New] != 1 || c.Refused[New] != 1 {
		t.Errorf("counts %+v", c)
	}
	if fmt.Sprint(OverUsual) != "over_usual" {
		t.Errorf("label %s", OverUsual)
	}
}

// TestSparseBurstyUser: a user who loads a page (a clump of 3) every 20 s
// to 40 s, established, is never charged as over usual.
func TestSparseBurstyUser(t *testing.T) {
	clk := &fakeClock{}
	src := &fakeStandings{m: map[netip.Addr]Standing{addr(1): StandingEstablished}}
	tb := NewTable(64, src, clk, testCfg)
	for i := 0; i < 60; i++ {
		for j := 0; j < 3; j++ {
			if c := tb.Classify(addr(1), true).Class; c != Established {
				t.Fatalf("clump %d request %d: %s", i, j, c)
			}
		}
		clk.advance(time.Duration(20+20*(i%2)) * time.Second)
	}
}

// TestExplainChargesNothing: Explain says what the next request would be
// charged as and changes nothing.
func TestExplainChargesNothing(t *testing.T) {
	clk := &fakeClock{}
	src := &fakeStandings{m: map[netip.Addr]Standing{addr(1): StandingEstablished}}
	tb := NewTable(64, src, clk, testCfg)
	if x := tb.Explain(addr(2), true); x.Tracked || x.Next != New {
		t.Errorf("unknown client: %+v", x)
	}
	for i := 0; i < 100; i++ {
		tb.Classify(addr(1), true)
	}
	x := tb.Explain(addr(1), true)
	if !x.Tracked || x.InWindow != 100 || x.Budget != 100 || x.Next != OverUsual || x.Standing != StandingEstablished {
		t.Errorf("explain after 100 requests: %+v, want 100 of a budget of 100 in the window, next over_usual", x)
	}
	if c := tb.Classify(addr(1), true).Class; c != OverUsual {
		t.Errorf("the 101st request: %s", c)
	}
	if y := tb.Explain(addr(1), true); y.InWindow != 101 {
		t.Errorf("explain charged: %d in the window, want 101", y.InWindow)
	}
}
