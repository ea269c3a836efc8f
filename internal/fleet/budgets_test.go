package fleet

import (
	"context"
	"math"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func TestMain(m *testing.M) {
	// go-redis logs every refused dial; the tests that stop Redis make many.
	redis.SetLogger(discardLogger{})
	os.Exit(m.Run())
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// memAggs is a host's data plane for these tests: cumulative counters the
// test advances, and the shares the fleet wrote.
type memAggs struct {
	mu      sync.Mutex
	c       map[string]*AggCounter
	shares  map[string]Share
	expires time.Time
}

func newMemAggs() *memAggs { return &memAggs{c: map[string]*AggCounter{}, shares: map[string]Share{}} }

func (m *memAggs) offer(key string, budget float64, packets uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.c[key]
	if !ok {
		c = &AggCounter{Key: key, Budget: budget}
		m.c[key] = c
	}
	c.Passed += packets
}

// offerBytes is offer with a byte budget and the packets' bytes.
func (m *memAggs) offerBytes(key string, budget, byteBudget float64, packets, bytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.c[key]
	if !ok {
		c = &AggCounter{Key: key, Budget: budget, ByteBudget: byteBudget}
		m.c[key] = c
	}
	c.Passed += packets
	c.PassedBytes += bytes
}

func (m *memAggs) FleetCounters() ([]AggCounter, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []AggCounter
	for _, c := range m.c {
		out = append(out, *c)
	}
	return out, nil
}

func (m *memAggs) ApplyShares(shares []Share, expires time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range shares {
		m.shares[s.Key] = s
	}
	m.expires = expires
	return nil
}

func (m *memAggs) share(key string) Share {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shares[key]
}

// clock is an injected clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type shareHost struct {
	f    *Fleet
	aggs *memAggs
	st   map[string]*aggState
	n    int
}

func newShareHost(t testing.TB, client redis.UniversalClient, name string, clk *clock) *shareHost {
	t.Helper()
	h := &shareHost{aggs: newMemAggs(), st: map[string]*aggState{}, n: 1}
	f, err := New(Options{Name: "t", Host: name, Interval: time.Second, Floor: 0.1, Client: client, Aggregates: h.aggs, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	h.f = f
	return h
}

func (h *shareHost) sync() { h.n = h.f.syncShares(context.Background(), h.st, h.n) }

const asnKey = "rule 1 asn 64500"

// interval offers each host its demand for one second of the injected
// clock and syncs every host.
func interval(clk *clock, hosts []*shareHost, demand []uint64) {
	clk.add(time.Second)
	for i, h := range hosts {
		h.aggs.offer(asnKey, 1000, demand[i])
	}
	for _, h := range hosts {
		h.sync()
	}
}

func fleetTotal(hosts []*shareHost, demand []uint64) float64 {
	sum := 0.0
	for i, h := range hosts {
		sum += math.Min(h.aggs.share(asnKey).Rate, float64(demand[i]))
	}
	return sum
}

// TestSharesTrackDemand runs three hosts against a real Redis with an
// injected clock: a 90/9/1 split of a flood 3x the budget gives shares in
// that proportion (plus the floor) that sum to the budget; the split
// flips to 1/9/90 and the shares follow within 3 intervals.
func TestSharesTrackDemand(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := &clock{t: time.Now()}
	var hosts []*shareHost
	for _, n := range []string{"a", "b", "c"} {
		hosts = append(hosts, newShareHost(t, srv.Client(t), n, clk))
	}
	split := []uint64{2700, 270, 30}
	for range 3 {
		interval(clk, hosts, split)
	}
	check := func(when string, want []float64) {
		t.Helper()
		sum := 0.0
		for i, h := range hosts {
			s := h.aggs.share(asnKey)
			if s.Static || math.Abs(s.Rate-want[i]) > 1 {
				t.Errorf("%s: host %d share %+v, want %.1f", when, i, s, want[i])
			}
			sum += s.Rate
		}
		if math.Abs(sum-1000) > 1 {
			t.Errorf("%s: shares sum to %.1f, want 1000", when, sum)
		}
	}
	each := 100.0 / 3
	check("90/9/1", []float64{each + 810, each + 81, each + 9})
	if got := fleetTotal(hosts, split); math.Abs(got-1000) > 100 {
		t.Errorf("fleet passes %.0f/s, want 1000 ± 10%%", got)
	}
	flip := []uint64{30, 270, 2700}
	for range 3 {
		interval(clk, hosts, flip)
	}
	check("1/9/90", []float64{each + 9, each + 81, each + 810})
	st := hosts[0].f.Status()
	if len(st.Members) != 3 || !st.RedisUp || st.ActiveAggregates != 1 || len(st.Shares) != 1 {
		t.Errorf("status %+v", st)
	}
}

// TestSharesFallbackAndDeadHost: with Redis gone every host takes budget ÷
// the fleet size it last saw, marked static, and keeps writing shares (no
// gap); when Redis returns the shares are proportional again; a host that
// stops syncing drops out of the others' fleet within deadAfter intervals.
func TestSharesFallbackAndDeadHost(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := &clock{t: time.Now()}
	var hosts []*shareHost
	for _, n := range []string{"a", "b", "c"} {
		hosts = append(hosts, newShareHost(t, testClient(t, srv.Addr()), n, clk))
	}
	split := []uint64{2700, 270, 30}
	for range 2 {
		interval(clk, hosts, split)
	}
	srv.Stop()
	before := hosts[0].aggs.expires
	interval(clk, hosts, split)
	for i, h := range hosts {
		s := h.aggs.share(asnKey)
		if !s.Static || math.Abs(s.Rate-1000.0/3) > 0.01 {
			t.Errorf("host %d without redis: %+v, want static 333.3", i, s)
		}
		if st := h.f.Status(); st.RedisUp || !st.Fallback {
			t.Errorf("host %d status %+v", i, st)
		}
	}
	if !hosts[0].aggs.expires.After(before) {
		t.Error("shares not rewritten (their expiry not moved) while redis is down: they would lapse")
	}
	srv.Restart()
	interval(clk, hosts, split)
	if s := hosts[0].aggs.share(asnKey); s.Static || s.Rate < 800 {
		t.Errorf("after redis returned: %+v", s)
	}
	// c stops: a and b count it for deadAfter intervals, then not.
	live := hosts[:2]
	for range deadAfter + 1 {
		interval(clk, live, split[:2])
	}
	st := hosts[0].f.Status()
	if len(st.Members) != 2 {
		t.Errorf("members after c died: %+v", st.Members)
	}
	sum := hosts[0].aggs.share(asnKey).Rate + hosts[1].aggs.share(asnKey).Rate
	if math.Abs(sum-1000) > 1 {
		t.Errorf("a and b share %.1f of 1000 after c died", sum)
	}
}

// TestSharesHostileRedis: demand fields of hosts that are not members, of
// dead hosts, malformed or absurd, do not move this host's share.
func TestSharesHostileRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := &clock{t: time.Now()}
	a := newShareHost(t, srv.Client(t), "a", clk)
	rc := srv.Client(t)
	ctx := context.Background()
	key := a.f.k.agg(asnKey)
	for range 2 {
		clk.add(time.Second)
		a.aggs.offer(asnKey, 1000, 500)
		rc.HSet(ctx, key, "ghost", "1e9 0 "+strconv.FormatInt(clk.Now().UnixMilli(), 10)+" 1e12 0", "b", "NaN 0 1 0 0", "c", "1e300 1 1 0 0",
			"a", "1e9 1e9 1 1e12 1e12")
		rc.ZAdd(ctx, a.f.k.members, redis.Z{Score: float64(clk.Now().UnixMilli()), Member: "b"}, redis.Z{Score: float64(clk.Now().UnixMilli()), Member: "{bad host}"})
		a.sync()
	}
	s := a.aggs.share(asnKey)
	// b is a live member without a valid demand: floor for b, the rest for a.
	if want := 1000 - 0.1*1000/2; math.Abs(s.Rate-want) > 0.01 {
		t.Errorf("share %+v, want %.1f", s, want)
	}
	if a.f.Status().Lists.Malformed < 2 {
		t.Errorf("malformed demands not counted: %+v", a.f.Status())
	}
}

// TestByteSharesTrackDemand: a rule with a packet and a byte budget. The
// hosts offer the same packets/s, but host a's packets are large (90% of
// the bytes): the packet shares stay equal, the byte shares follow the
// byte demand (90/9/1 plus the floor, summing to the byte budget); the
// byte split flips and the byte shares follow within 3 intervals; with
// Redis gone the byte share is static too (budget ÷ hosts).
func TestByteSharesTrackDemand(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := &clock{t: time.Now()}
	var hosts []*shareHost
	for _, n := range []string{"a", "b", "c"} {
		hosts = append(hosts, newShareHost(t, srv.Client(t), n, clk))
	}
	const pktBudget, byteBudget = 1000.0, 1e6
	step := func(bytes []uint64) {
		clk.add(time.Second)
		for i, h := range hosts {
			h.aggs.offerBytes(asnKey, pktBudget, byteBudget, 900, bytes[i])
		}
		for _, h := range hosts {
			h.sync()
		}
	}
	check := func(when string, want []float64) {
		t.Helper()
		sum, psum := 0.0, 0.0
		for i, h := range hosts {
			s := h.aggs.share(asnKey)
			if s.Static || s.ByteBudget != byteBudget || math.Abs(s.ByteRate-want[i]) > 1 || math.Abs(s.Rate-pktBudget/3) > 0.01 {
				t.Errorf("%s: host %d share %+v, want %.0f bytes/s and %.1f packets/s", when, i, s, want[i], pktBudget/3)
			}
			sum += s.ByteRate
			psum += s.Rate
		}
		if math.Abs(sum-byteBudget) > 1 || math.Abs(psum-pktBudget) > 0.01 {
			t.Errorf("%s: byte shares sum to %.1f (want %.0f), packet shares to %.2f (want %.0f)", when, sum, byteBudget, psum, pktBudget)
		}
	}
	each := 0.1 * byteBudget / 3
	split := []uint64{2_700_000, 270_000, 30_000}
	for range 3 {
		step(split)
	}
	check("bytes 90/9/1", []float64{each + 0.9*byteBudget*0.9, each + 0.9*byteBudget*0.09, each + 0.9*byteBudget*0.01})
	if s := hosts[0].aggs.share(asnKey); math.Abs(s.ByteDemand-2.7e6) > 1 || math.Abs(s.FleetByteDemand-3e6) > 1 {
		t.Errorf("a's byte demand %+v, want 2.7e6 of 3e6", s)
	}
	// The flip: followed within 3 intervals.
	flip := []uint64{30_000, 270_000, 2_700_000}
	for range 3 {
		step(flip)
	}
	check("bytes 1/9/90", []float64{each + 0.9*byteBudget*0.01, each + 0.9*byteBudget*0.09, each + 0.9*byteBudget*0.9})
	st := hosts[2].f.Status()
	if len(st.Shares) != 1 || math.Abs(st.Shares[0].ByteShare-(each+0.9*byteBudget*0.9)) > 1 || st.Shares[0].ByteBudget != byteBudget {
		t.Errorf("c's status shows %+v, want its byte share", st.Shares)
	}
	srv.Stop()
	step(flip)
	for i, h := range hosts {
		if s := h.aggs.share(asnKey); !s.Static || math.Abs(s.ByteRate-byteBudget/3) > 0.01 || math.Abs(s.Rate-pktBudget/3) > 0.01 {
			t.Errorf("redis gone: host %d share %+v, want static budget ÷ 3 in both dimensions", i, s)
		}
	}
}

// TestIdleAggregateStaysDropped: an instance that saw no traffic for
// keepActive intervals is no longer published, and stays so while the
// data plane keeps counting it (its counters do not move); traffic makes
// it active again at the next sync; an instance gone from the counters is
// forgotten.
func TestIdleAggregateStaysDropped(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := &clock{t: time.Now()}
	h := newShareHost(t, srv.Client(t), "a", clk)
	step := func(packets uint64) int {
		clk.add(time.Second)
		h.aggs.offer(asnKey, 1000, packets)
		h.sync()
		return h.f.Status().ActiveAggregates
	}
	step(100)
	if n := step(100); n != 1 {
		t.Fatalf("with traffic: %d active, want 1", n)
	}
	for i := 1; i <= keepActive; i++ {
		if n := step(0); n != 1 {
			t.Fatalf("idle interval %d of %d: %d active, want 1 (kept)", i, keepActive, n)
		}
	}
	for i := range 2 * keepActive {
		if n := step(0); n != 0 {
			t.Fatalf("idle past keepActive (+%d): %d active, want 0: an idle instance came back", i+1, n)
		}
	}
	if n := step(5); n != 1 {
		t.Fatalf("traffic again: %d active, want 1", n)
	}
	if _, ok := h.st[asnKey]; !ok {
		t.Fatal("state of a counted instance forgotten")
	}
	// Gone from the data plane's counters (evicted), idle: forgotten.
	h.aggs.mu.Lock()
	delete(h.aggs.c, asnKey)
	h.aggs.mu.Unlock()
	for range keepActive + 2 {
		clk.add(time.Second)
		h.sync()
	}
	if _, ok := h.st[asnKey]; ok || h.f.Status().ActiveAggregates != 0 {
		t.Fatalf("an evicted, idle instance is still held: %+v", h.f.Status())
	}
}
