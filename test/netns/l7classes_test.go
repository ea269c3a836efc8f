package netns_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgeguard/edgeguard/internal/testbed"
)

// The L7 class ranking under an HTTP flood (issue 23, docs/operations.md
// "Class ranking at L7"): a few hundred real hosts inside the users' ASN,
// spread over twenty /24s, complete every TCP handshake and each make
// requests at a user's own average rate; together several times what the
// upstream serves. Users had been active for established_after and more
// before. Every request counts only if answered (200) within 1 s, and
// nothing is retried.

const (
	l7cBotNets    = 20                    // /24s of the users' ASN the bots spread over
	l7cBotsPerNet = 13                    // hosts per /24: 260 bots
	l7cRate       = 2                     // requests per second, users and bots alike
	l7cClump      = 2                     // a user's requests come in clumps of 2 (mean gap 1 s)
	l7cSlots      = 4                     // the upstream's capacity: 4 requests at once,
	l7cService    = 50 * time.Millisecond // each taking 50 ms: 80/s
	// A gap longer than established_after restarts a new client's clean
	// history: with 8 s, one gap of a user's in e^8 ≈ 3,000.
	l7cEstablished = 8 * time.Second
	l7cWarm        = l7cEstablished + 8*time.Second
	l7cAttack      = 16 * time.Second
	l7cArrivals    = 2 // client namespaces whose users start with the attack
)

// l7cPolicy: XDP out of the way (per-source budgets far above anyone's
// rate: this is the L7 stage's test), a short established_after, and an
// L7 stage whose upstream takes l7cSlots requests at once, with a queue,
// a per-IP limit above a user's rate, per-/24 and per-ASN budgets (their
// default reserve: half, for the first class), and the default class
// ranking.
const l7cPolicy = `defaults:
  per_source: {packets: {rate: 10000/s, burst: 10000}}
standing: {established_after: %s}
l7:
  listen: 0.0.0.0:8080
  upstream: http://%s
  engine: %s
  concurrency: {max_in_flight: %d, queue: 64, queue_timeout: 900ms}
  routes:
    - name: api
      match: {path_prefix: /}
      limits:
        - {name: per-ip, key: ip, rate: 30/s, burst: 30}
        - {name: per-24, key: prefix, rate: 20/s, burst: 20}
        - {name: per-asn, key: asn, rate: 70/s, burst: 70}
`

// upstreamMeter is the upstream: it serves each request in l7cService,
// whether or not the proxy is still waiting for the answer (as a busy
// application server that never looks at its client's connection does),
// and records the most requests it ever held at once and per second.
type upstreamMeter struct {
	inFlight, maxInFlight atomic.Int64
	mu                    sync.Mutex
	perSecond             map[int64]int
}

func (u *upstreamMeter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.inFlight.Add(1)
	for {
		m := u.maxInFlight.Load()
		if n <= m || u.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	u.mu.Lock()
	u.perSecond[time.Now().Unix()]++
	u.mu.Unlock()
	time.Sleep(l7cService)
	u.inFlight.Add(-1)
	io.WriteString(w, "ok")
}

func (u *upstreamMeter) maxPerSecond() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := 0
	for _, n := range u.perSecond {
		m = max(m, n)
	}
	return m
}

// httpTally is what one group of clients saw.
type httpTally struct {
	sent, ok atomic.Int64
	mu       sync.Mutex
	failed   map[string]int // by status, or "error"
}

func (t *httpTally) fail(why string) {
	t.mu.Lock()
	if t.failed == nil {
		t.failed = map[string]int{}
	}
	t.failed[why]++
	t.mu.Unlock()
}

func (t *httpTally) rate() float64 {
	if t.sent.Load() == 0 {
		return 1
	}
	return float64(t.ok.Load()) / float64(t.sent.Load())
}

func (t *httpTally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("%d/%d answered (%.2f%%, failed %v)", t.ok.Load(), t.sent.Load(), 100*t.rate(), t.failed)
}

var reasonRE = regexp.MustCompile(`"reason":"([a-z_]+)"`)

// httpClient is one client address making requests to url: keep-alive (one
// transport whose connections are reused) or a new connection per request.
type httpClient struct {
	c   *http.Client
	url string
}

func newHTTPClient(ns *testbed.Namespace, src netip.Addr, url string, keepAlive bool) *httpClient {
	tr := nsTransport(ns, src, time.Second)
	tr.DisableKeepAlives = !keepAlive
	tr.MaxIdleConnsPerHost = 8
	return &httpClient{c: &http.Client{Transport: tr, Timeout: time.Second}, url: url}
}

// get makes one request and counts it in t: answered means 200 within 1 s.
func (h *httpClient) get(ctx context.Context, t *httpTally) {
	t.sent.Add(1)
	req, _ := http.NewRequestWithContext(ctx, "GET", h.url, nil)
	resp, err := h.c.Do(req)
	if err != nil {
		why := "error"
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			why = "timeout"
		}
		t.fail(why)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		t.fail("body")
	case resp.StatusCode == http.StatusOK:
		t.ok.Add(1)
	default:
		why := strconv.Itoa(resp.StatusCode)
		if m := reasonRE.FindSubmatch(body); m != nil {
			why += " " + string(m[1])
		}
		t.fail(why)
	}
}

// run sends until ctx ends: clumps of clump requests at once (a page and
// its assets) at exponential gaps keeping the average at rate per second
// (clump 1: Poisson arrivals, as independent sources send), each request
// on its own goroutine (a slow answer does not delay the next).
func (h *httpClient) run(ctx context.Context, wg *sync.WaitGroup, rng *rand.Rand, rate, clump int, t func() *httpTally) {
	defer wg.Done()
	mean := float64(clump) / float64(rate)
	for {
		gap := time.Duration(rng.ExpFloat64() * mean * float64(time.Second))
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		tally := t()
		for range clump {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.get(context.WithoutCancel(ctx), tally)
			}()
		}
	}
}

// addBots gives the attacker's namespace l7cBotNets × l7cBotsPerNet
// addresses of its own inside the bots' /24s (the edge routes them back
// to it), so that each bot completes real TCP handshakes.
func addBots(t *testing.T, c *testbed.Client) []netip.Addr {
	t.Helper()
	link, err := c.NS.Netlink().LinkByName("eg-up")
	if err != nil {
		t.Fatal(err)
	}
	var bots []netip.Addr
	for i, p := range kgBotNets()[:l7cBotNets] {
		for h := 0; h < l7cBotsPerNet; h++ {
			a := p.Addr().As4()
			a[3] = byte(10 + h)
			addr := netip.AddrFrom4(a)
			if err := c.NS.Netlink().AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				t.Fatalf("bot %d address %s: %v", i, addr, err)
			}
			bots = append(bots, addr)
		}
	}
	return bots
}

// TestL7ClassesHTTPFlood: 260 real hosts over 20 /24s of the users' ASN,
// each at a user's own rate (half keep-alive, half a new connection per
// request), ~8× what the upstream serves: users who were active before
// keep ≥ 99% of their requests answered within 1 s, the upstream never
// holds more than its capacity, bots get the leftover. Users who arrive
// during the attack are new: they get what a bot gets (the leftover,
// shared with the bots), and no more.
//
// A shared 2-core machine stalls now and then: a stall of most of a
// second leaves users' requests unanswered within 1 s whatever the design.
// The test measures its own scheduling stalls during the attack
// (stallMeter); only when the shares are missed *and* such a stall was
// measured does it run the attack once more (the brief's one rerun), and
// it prints both runs. The upstream's capacity is never excused.
func TestL7ClassesHTTPFlood(t *testing.T) {
	for _, engine := range []string{"event-loop", "net-http"} {
		t.Run(engine, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				var missed []string
				var stall time.Duration
				t.Run(fmt.Sprintf("attempt-%d", attempt), func(t *testing.T) {
					missed, stall = testL7ClassesHTTPFlood(t, engine)
				})
				if len(missed) == 0 {
					return
				}
				if attempt == 1 && stall >= l7cStall {
					t.Logf("attempt 1 missed (%v) with a %v stall of the machine: once more", missed, stall)
					continue
				}
				for _, m := range missed {
					t.Error(m)
				}
				return
			}
		})
	}
}

// l7cStall is a stall of the test's own process (a ticker's lateness) that
// can make a request miss its 1 s on its own.
const l7cStall = 300 * time.Millisecond

// stallMeter measures the longest lateness of a 10 ms ticker until stop.
func stallMeter() (stop func() time.Duration) {
	done := make(chan struct{})
	worst := make(chan time.Duration, 1)
	go func() {
		const tick = 10 * time.Millisecond
		tk := time.NewTicker(tick)
		defer tk.Stop()
		last, m := time.Now(), time.Duration(0)
		for {
			select {
			case <-done:
				worst <- m
				return
			case now := <-tk.C:
				m = max(m, now.Sub(last)-tick)
				last = now
			}
		}
	}()
	return func() time.Duration { close(done); return <-worst }
}

// testL7ClassesHTTPFlood runs the scenario once. It fails t on what no
// stall excuses (the upstream above its capacity, the offered load, the
// class counts, explain) and returns the shares it missed (users, bots,
// arrivals) and the longest stall measured during the attack.
func testL7ClassesHTTPFlood(t *testing.T, engine string) (missed []string, stall time.Duration) {
	s := newBotnetScenario(t, false, l7cArrivals)
	up := &upstreamMeter{perSecond: map[int64]int{}}
	upAddr := serveHTTP(t, s.lab.Star.Edge, netip.AddrPortFrom(s.lab.Legit[0].EdgeAddr4, 9200), up.ServeHTTP)
	s.start(fmt.Sprintf(l7cPolicy, l7cEstablished, upAddr, engine, l7cSlots))
	bots := addBots(t, s.lab.Attackers[0])

	url := func(c *testbed.Client) string {
		return "http://" + netip.AddrPortFrom(c.EdgeAddr4, 8080).String() + "/"
	}
	var users, arrivals []*httpClient
	for i, c := range s.lab.Legit {
		for j, src := range []netip.Addr{c.Src4, c.Alt4} {
			h := newHTTPClient(c.NS, src, url(c), (i+j)%2 == 0)
			if i < kgUsers {
				users = append(users, h)
			} else {
				arrivals = append(arrivals, h)
			}
		}
	}
	attacker := s.lab.Attackers[0]
	var botClients []*httpClient
	for i, a := range bots {
		botClients = append(botClients, newHTTPClient(attacker.NS, a, url(attacker), i%2 == 0))
	}

	var before, during, arrived, botTally httpTally
	var attacking atomic.Bool
	userTally := func() *httpTally {
		if attacking.Load() {
			return &during
		}
		return &before
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, h := range users {
		wg.Add(1)
		go h.run(ctx, &wg, rand.New(rand.NewPCG(uint64(i), 1)), l7cRate, l7cClump, userTally)
	}
	time.Sleep(l7cWarm)

	attacking.Store(true)
	stopMeter := stallMeter()
	floodCtx, stopFlood := context.WithTimeout(ctx, l7cAttack)
	defer stopFlood()
	var fwg sync.WaitGroup
	for i, h := range botClients {
		fwg.Add(1)
		go h.run(floodCtx, &fwg, rand.New(rand.NewPCG(uint64(i), 2)), l7cRate, 1, func() *httpTally { return &botTally })
	}
	for i, h := range arrivals {
		fwg.Add(1)
		go h.run(floodCtx, &fwg, rand.New(rand.NewPCG(uint64(i), 3)), l7cRate, l7cClump, func() *httpTally { return &arrived })
	}
	<-floodCtx.Done()
	cancel()
	fwg.Wait()
	wg.Wait()
	stall = stopMeter()

	capacity := float64(l7cSlots) / l7cService.Seconds()
	offered := float64(botTally.sent.Load()+during.sent.Load()+arrived.sent.Load()) / l7cAttack.Seconds()
	st := s.stats()
	report(t, "%s: users before the attack %v; during %v (margin %.2f%% over 99%%); arrivals %v; bots %v; "+
		"offered %.0f/s = %.1f× the upstream's %.0f/s; upstream (it serves every request it receives) at most %d at once (capacity %d, margin %d), "+
		"%d in its busiest second; longest stall of the test's process %v; classes %+v",
		engine, &before, &during, 100*(during.rate()-0.99), &arrived, &botTally, offered, offered/capacity, capacity,
		up.maxInFlight.Load(), l7cSlots, l7cSlots-up.maxInFlight.Load(), up.maxPerSecond(), stall.Round(time.Millisecond), st.L7Classes)

	if offered < 5*capacity {
		t.Errorf("offered %.0f/s, under 5× the upstream's %.0f/s: the test is not testing", offered, capacity)
	}
	if r := during.rate(); r < 0.99 {
		missed = append(missed, fmt.Sprintf("users during the attack: %v, want ≥ 99%%", &during))
	}
	if m, limit := up.maxPerSecond(), 70+70+10; m > limit {
		t.Errorf("the upstream served %d requests in one second; the ASN's budget allows %d (burst and rate, 10 for the edges)", m, limit)
	}
	if m := up.maxInFlight.Load(); m > l7cSlots {
		t.Errorf("the upstream held %d requests at once, capacity %d", m, l7cSlots)
	}
	// The bots get the leftover: what the upstream served beyond the
	// users, not nothing, and far from all.
	if b := botTally.rate(); b <= 0 || b > 0.5 {
		missed = append(missed, fmt.Sprintf("bots: %v, want the leftover (some, under half)", &botTally))
	}
	// Arrivals are new: the bots' share, not the users'. With ~30
	// answered of theirs the bound is loose: under half, and within 3× (or
	// 5 points) of the bots'.
	if a, b := arrived.rate(), botTally.rate(); a > 0.5 || a > 3*b+0.05 || a < b/3-0.05 {
		missed = append(missed, fmt.Sprintf("arrivals %v against bots %v: want the bots' share", &arrived, &botTally))
	}
	// edgectl explain: what a user's and a bot's next request would be.
	if x := s.explain(s.lab.Legit[0].Src4.String()).L7; x == nil || x.Next != "established" {
		t.Errorf("explain %s: l7 %+v, want the next request established", s.lab.Legit[0].Src4, x)
	}
	if x := s.explain(bots[0].String()).L7; x == nil || x.Next != "new" || x.History {
		t.Errorf("explain bot %s: l7 %+v, want new without history", bots[0], x)
	}
	classes := map[string][2]uint64{}
	for _, c := range st.L7Classes {
		classes[c.Class] = [2]uint64{c.Admitted, c.Refused}
	}
	if classes["established"][0] == 0 || classes["new"][1] == 0 {
		t.Errorf("class counts %v: want established admitted and new refused", st.L7Classes)
	}
	return missed, stall
}
