package redislimit

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// redisCount reads the current window's count from a sliding-window state.
func redisCount(t *testing.T, f *fixture, key, rule string) int64 {
	t.Helper()
	v, err := f.rdb.Get(context.Background(), redisKey("eg:l7:", key, rule)).Result()
	if err != nil {
		t.Fatalf("read state of %q: %v", key, err)
	}
	parts := strings.Split(v, ":")
	n, err := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	if err != nil {
		t.Fatalf("state %q: %v", v, err)
	}
	return n
}

func hybridRuleFor(limit int64) Rule {
	return Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: time.Hour,
		Hybrid: &Hybrid{SyncInterval: 100 * time.Millisecond, MaxLease: 50, Share: 2}}
}

// Two instances share one Redis. Over a scripted timeline each admits from
// its own lease; together they must stay within limit + (N−1)·MaxLease and
// still reach the limit, and every admitted request is counted in Redis.
func TestHybridOvershootTwoInstances(t *testing.T) {
	f := newFixture(t)
	const limit, lease, instances = 1000, 50, 2
	newInstance := func() *Limiter {
		return f.limiter(t, Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(),
			Rules: []Rule{hybridRuleFor(limit)}, SyncEvery: -1})
	}
	a, b := newInstance(), newInstance()
	admitted := map[*Limiter]int64{}
	for range 3000 { // 3s of 1ms steps, 6 requests per step: 18000 offered
		f.advance(time.Millisecond)
		for _, l := range []*Limiter{a, b, a, b, a, b} {
			if allow(t, l, "hot-key").Decision.Allowed {
				admitted[l]++
			}
		}
	}
	a.Sync(context.Background())
	b.Sync(context.Background())
	total := admitted[a] + admitted[b]
	t.Logf("admitted A=%d B=%d total=%d; bound %d", admitted[a], admitted[b], total, limit+(instances-1)*lease)
	if total > limit+(instances-1)*lease {
		t.Fatalf("admitted %d, over the bound limit + (N−1)·L = %d", total, limit+(instances-1)*lease)
	}
	if total < limit {
		t.Fatalf("admitted %d, under the limit %d: leases wasted quota", total, limit)
	}
	if admitted[a] < limit/4 || admitted[b] < limit/4 {
		t.Fatalf("unfair split A=%d B=%d", admitted[a], admitted[b])
	}
	if got := redisCount(t, f, "hot-key", "hot"); got != total {
		t.Fatalf("Redis counted %d, instances admitted %d: counts lost or doubled", got, total)
	}
}

// The same bound with 8 goroutines per instance racing a moving clock.
func TestHybridOvershootConcurrent(t *testing.T) {
	f := newFixture(t)
	const limit, lease, instances = 500, 50, 2
	var total atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		for i := 0; i < 200_000; i++ {
			select {
			case <-done:
				return
			default:
				f.advance(10 * time.Microsecond)
			}
		}
	}()
	for range instances {
		l := f.limiter(t, Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(),
			Rules: []Rule{hybridRuleFor(limit)}, SyncEvery: -1})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 400 {
					res, err := l.Allow(context.Background(), "hot-key")
					if err != nil {
						t.Error(err)
						return
					}
					if res.Decision.Allowed {
						total.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(done)
	n := total.Load()
	t.Logf("admitted %d of 6400 offered; bound %d", n, limit+(instances-1)*lease)
	if n > limit+(instances-1)*lease || n < limit {
		t.Fatalf("admitted %d, want within [limit %d, limit + (N−1)·L = %d]", n, limit, limit+(instances-1)*lease)
	}
}

// A request a plain rule refuses gives its lease reservation back, with
// hosts sharing the rule (share 2) and on a single host (share 1, whose
// view of the window gives the units back too).
func TestHybridRefundWhenAnotherRuleRefuses(t *testing.T) {
	for _, share := range []int64{2, 1} {
		t.Run(fmt.Sprintf("share %d", share), func(t *testing.T) { testHybridRefund(t, share) })
	}
}

func testHybridRefund(t *testing.T, share int64) {
	f := newFixture(t)
	r := hybridRuleFor(1000)
	r.Hybrid.Share = share
	l := f.limiter(t, Config{SyncEvery: -1, Rules: []Rule{
		r,
		{Name: "strict", Algorithm: GCRA, Limit: 2, Window: time.Hour},
	}})
	var allowed int
	for range 10 {
		res := allow(t, l, "k")
		if res.Decision.Allowed {
			allowed++
		}
		if res.Rules[0].Source != SourceLease {
			t.Fatalf("hybrid rule decided by %s, want lease", res.Rules[0].Source)
		}
	}
	l.Sync(context.Background())
	if got := redisCount(t, f, "k", "hot"); allowed != 2 || got != 2 {
		t.Fatalf("allowed %d, hybrid count %d; want 2 and 2 (refused requests never consume quota)", allowed, got)
	}
}

// With Redis down, a hybrid rule's failure policy applies and its unsynced
// counts survive until Redis is back.
func TestHybridRedisDown(t *testing.T) {
	f := newFixture(t)
	r := hybridRuleFor(1000)
	r.Failure = FailClosed
	l := f.limiter(t, Config{SyncEvery: -1, Rules: []Rule{r}})
	for range 5 {
		allow(t, l, "k")
	}
	f.srv.Stop()
	f.advance(200 * time.Millisecond) // lease expired: the next request syncs
	for range 5 {
		if res := allow(t, l, "k"); res.Decision.Allowed || res.Rules[0].Source != SourceFailClosed {
			t.Fatalf("redis down: %+v, want refused by fail-closed", res)
		}
	}
	if l.BreakerState() != BreakerOpen {
		t.Fatalf("breaker %s, want open", l.BreakerState())
	}
	f.srv.Restart()
	f.advance(time.Second)
	allow(t, l, "k") // starts the probe
	testenv.WaitFor(t, "the probe to close the breaker", func() bool { return l.BreakerState() == BreakerClosed })
	res := allow(t, l, "k")
	if !res.Decision.Allowed || res.Rules[0].Source != SourceLease {
		t.Fatalf("after recovery: %+v", res)
	}
	l.Sync(context.Background())
	// Restarted empty; the 5 counts from before the outage were kept and
	// flushed with the one after it.
	if got := redisCount(t, f, "k", "hot"); got != 6 {
		t.Fatalf("count after recovery %d, want 6", got)
	}
}

// offered is a bursty timeline: per 50 ms step, a clump of 0-7 requests
// (the same pseudo-random clumps for every run), about 3.5× a rate of
// 20/s.
func offered(steps int) []int {
	rng := rand.New(rand.NewPCG(26, 2))
	out := make([]int, steps)
	for i := range out {
		out[i] = rng.IntN(8)
	}
	return out
}

// hybridTimeline runs limiters over the offered timeline for one key, the
// clumps of step s dealt round-robin over hosts(s), every limiter flushed
// every syncEvery as the background loop does. Each admitted request is
// checked against truth, the sliding window at bound(s) per window over
// what was really admitted and when: a request truth refuses was admitted
// over the bound. It returns the admitted count and the sliding window's
// counts (previous, current) of what was admitted, at the end.
func hybridTimeline(t *testing.T, f *fixture, hosts func(s int) []*Limiter, window time.Duration, bound func(s int) int64, syncEvery time.Duration, steps []int) (admitted, prev, curr int64) {
	t.Helper()
	// record keeps every admission; a window at the step's bound judges
	// the next one from the same state.
	record, err := l7.NewSlidingWindow(1<<20, window)
	if err != nil {
		t.Fatal(err)
	}
	judges := map[int64]*l7.SlidingWindow{}
	judge := func(b int64) *l7.SlidingWindow {
		if judges[b] == nil {
			if judges[b], err = l7.NewSlidingWindow(b, window); err != nil {
				t.Fatal(err)
			}
		}
		return judges[b]
	}
	// margins: per bound, the least by which it exceeded the smallest
	// limit whose window would still admit an admission.
	margins := map[int64]int64{}
	var state l7.State
	const step = 50 * time.Millisecond
	var sinceSync time.Duration
	i := 0
	var ls []*Limiter
	for s, clump := range steps {
		ls = hosts(s)
		b := bound(s)
		for range clump {
			l := ls[i%len(ls)]
			i++
			if !allow(t, l, "k").Decision.Allowed {
				continue
			}
			admitted++
			now := f.script.Now()
			if _, d := judge(b).Take(state, now, 1); !d.Allowed {
				t.Fatalf("step %d: admitted the request the sliding window at %d/%s over all admissions refuses (admitted so far %d)", s, b, window, admitted)
			}
			lo, hi := int64(1), b // the smallest admitting limit is in [lo, hi]
			for lo < hi {
				if mid := (lo + hi) / 2; func() bool { _, d := judge(mid).Take(state, now, 1); return d.Allowed }() {
					hi = mid
				} else {
					lo = mid + 1
				}
			}
			if m, ok := margins[b]; !ok || b-lo < m {
				margins[b] = b - lo
			}
			state, _ = record.Take(state, f.script.Now(), 1)
		}
		f.advance(step)
		if sinceSync += step; sinceSync >= syncEvery {
			sinceSync = 0
			for _, l := range ls {
				l.Sync(context.Background())
			}
		}
	}
	for _, l := range ls {
		l.Sync(context.Background())
	}
	for b, m := range margins {
		t.Logf("margin: at bound %d the tightest admission was %d under it (a window of %d would have admitted it)", b, m, b-m)
	}
	_, prev, curr = record.Counts(state, f.script.Now())
	return admitted, prev, curr
}

// always is a timeline's unchanging hosts or bound.
func always[T any](v T) func(int) T { return func(int) T { return v } }

// redisWindow reads a sliding-window state's (previous, current) counts as
// of the scripts' clock now.
func redisWindow(t *testing.T, f *fixture, key, rule string, window time.Duration) (prev, curr int64) {
	t.Helper()
	v, err := f.rdb.Get(context.Background(), redisKey("eg:l7:", key, rule)).Result()
	if err != nil {
		t.Fatalf("read state of %q: %v", key, err)
	}
	var idx int64
	if _, err := fmt.Sscanf(v, "%d:%d:%d", &idx, &prev, &curr); err != nil {
		t.Fatalf("state %q: %v", v, err)
	}
	now := f.script.Now() / int64(time.Microsecond) / int64(window/time.Microsecond)
	switch idx {
	case now:
		return prev, curr
	case now - 1:
		return curr, 0
	}
	return 0, 0
}

// One host (share 1, the policy's hosts: 1), with the policy's default
// lease (⌈count ÷ 4⌉) and with a lease of the rate's count (the default
// before hosts at hosts: 1 checked for each other): over 10 windows of
// bursty traffic it never admits what the sliding window over its true
// admissions refuses (the bound is the limit itself), it admits about what
// the local backend admits on the same timeline, every admission reaches
// Redis, it needs a few round trips per window instead of one per admitted
// request, and it never finds counts it did not report.
func TestHybridSingleHost(t *testing.T) {
	const limit = 20
	for _, lease := range []int64{SingleLease(limit), limit} {
		t.Run(fmt.Sprintf("lease %d", lease), func(t *testing.T) { testHybridSingleHost(t, limit, lease) })
	}
}

func testHybridSingleHost(t *testing.T, limit, lease int64) {
	f := newFixture(t)
	const window = time.Second
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: window,
		Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: lease, Share: 1}}
	reg := prometheus.NewRegistry()
	logs := &testenv.SyncBuffer{}
	l := f.limiter(t, Config{Registerer: reg, Rules: []Rule{rule}, SyncEvery: -1, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	steps := offered(200) // 10 s
	admitted, prev, curr := hybridTimeline(t, f, always([]*Limiter{l}), window, always[int64](limit), time.Second, steps)

	// The local backend on the same timeline: the reference.
	local, err := l7.NewSlidingWindow(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	var st l7.State
	var ref, total int64
	now := f.script.Now() - int64(len(steps))*int64(50*time.Millisecond)
	for _, clump := range steps {
		for range clump {
			total++
			var d l7.Decision
			if st, d = local.Take(st, now, 1); d.Allowed {
				ref++
			}
		}
		now += int64(50 * time.Millisecond)
	}
	trips := roundTrips(t, reg, "lease")
	t.Logf("offered %d over 10 s; admitted %d, the local backend %d (%.0f%%); %d lease round trips (%.2f per admitted request)",
		total, admitted, ref, 100*float64(admitted)/float64(ref), trips, float64(trips)/float64(admitted))
	if admitted < ref*85/100 {
		t.Fatalf("admitted %d, under 85%% of the local backend's %d on the same timeline", admitted, ref)
	}
	// Counts reach Redis in the windows they were admitted in.
	if rp, rc := redisWindow(t, f, "k", "hot", window); rp != prev || rc != curr {
		t.Fatalf("Redis's window holds %d, %d; admitted %d, %d in the last two windows", rp, rc, prev, curr)
	}
	if trips > uint64(admitted)/4 {
		t.Fatalf("%d lease round trips for %d admitted requests: want at most one per 4", trips, admitted)
	}
	// Alone, it never finds counts it did not report.
	if n := foreignCounts(t, reg, "hot"); n != 0 || strings.Contains(logs.String(), foreignWarning) {
		t.Fatalf("a host alone found %v foreign counts; log:\n%s", n, logs)
	}
}

// foreignWarning is the start of the warning a host at hosts: 1 logs when
// another host writes its keys.
const foreignWarning = "l7.redis.hosts is 1 but another host writes"

// foreignCounts reads edgeguard_l7_redis_hybrid_foreign_counts_total for a
// rule.
func foreignCounts(t *testing.T, reg *prometheus.Registry, rule string) float64 {
	t.Helper()
	return gathered(t, reg, "edgeguard_l7_redis_hybrid_foreign_counts_total", "rule", rule).GetCounter().GetValue()
}

// foreignMode reports whether l's lease of key decides with fixed grants
// because its window held foreign counts at the last sync.
func foreignMode(l *Limiter, key string) bool {
	h := l.hybrid[0]
	h.mu.Lock()
	defer h.mu.Unlock()
	ls := h.leases[key]
	return ls != nil && ls.foreign
}

// Three hosts share a key, each left at hosts: 1 (Share 1, the policy's
// default lease for it, ⌈count ÷ 4⌉): each decides from the window as if alone until a
// sync shows it counts it did not report, then with fixed grants of at
// most ⌈count ÷ 10⌉. Over 10 windows of bursty traffic dealt round-robin,
// every admission is within the sliding window at Limit + 2 × lease over
// all true admissions until every host has seen the others and two windows
// have passed (what they admitted alone has slid out), and within
// Limit + 2 × ⌈count ÷ 10⌉ after; each host counts foreign counts and
// warns once.
func TestHybridForeignHosts(t *testing.T) {
	f := newFixture(t)
	const limit, hosts, window = 60, 3, time.Second
	lease, fleet := SingleLease(limit), FleetLease(limit, 1)
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: window,
		Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: lease, Share: 1}}
	var ls []*Limiter
	var regs []*prometheus.Registry
	var logs []*testenv.SyncBuffer
	for range hosts {
		reg, buf := prometheus.NewRegistry(), &testenv.SyncBuffer{}
		regs, logs = append(regs, reg), append(logs, buf)
		ls = append(ls, f.limiter(t, Config{Client: f.srv.Client(t), Registerer: reg, Rules: []Rule{rule}, SyncEvery: -1,
			Logger: slog.New(slog.NewTextHandler(buf, nil)), LogEvery: time.Minute}))
	}
	base := offered(200)
	steps := make([]int, len(base))
	for i, c := range base {
		steps[i] = 3 * c
	}
	const stepsPerWindow = int(window / (50 * time.Millisecond))
	seen := -1           // the first step at which every host decides with fixed grants
	maxGrant := int64(0) // the largest grant a host held while deciding with them
	bound := func(s int) int64 {
		for _, l := range ls {
			h := l.hybrid[0]
			h.mu.Lock()
			if ls := h.leases["k"]; ls != nil && ls.foreign {
				maxGrant = max(maxGrant, ls.grant)
			}
			h.mu.Unlock()
		}
		if seen < 0 {
			all := true
			for _, l := range ls {
				all = all && foreignMode(l, "k")
			}
			if all {
				seen = s
			}
		}
		if seen < 0 || s < seen+2*stepsPerWindow {
			return limit + (hosts-1)*lease
		}
		return limit + (hosts-1)*fleet
	}
	admitted, _, _ := hybridTimeline(t, f, always(ls), window, bound, time.Second, steps)
	t.Logf("admitted %d over 10 s (10 windows of %d); every host on fixed grants from %.2f s; bound %d per window until %.2f s, %d after",
		admitted, limit, float64(seen)/float64(stepsPerWindow), limit+(hosts-1)*lease,
		float64(seen+2*stepsPerWindow)/float64(stepsPerWindow), limit+(hosts-1)*fleet)
	if seen < 0 || seen > 3*stepsPerWindow {
		t.Fatalf("every host on fixed grants from step %d, want by 3 s (step %d)", seen, 3*stepsPerWindow)
	}
	if admitted < 8*limit {
		t.Fatalf("admitted %d in 10 windows of %d: fixed grants wasted the quota", admitted, limit)
	}
	if maxGrant > fleet {
		t.Fatalf("a host held a grant of %d with others writing the key, want at most ⌈count ÷ 10⌉ = %d", maxGrant, fleet)
	}
	for i, l := range ls {
		n := foreignCounts(t, regs[i], "hot")
		warnings := strings.Count(logs[i].String(), foreignWarning)
		t.Logf("host %d: %.0f foreign counts, %d warning(s)", i, n, warnings)
		if n == 0 || warnings != 1 || !strings.Contains(logs[i].String(), "rule=hot") {
			t.Fatalf("host %d: %.0f foreign counts, %d warnings, want > 0 and 1 for rule hot; log:\n%s", i, n, warnings, logs[i])
		}
		if !foreignMode(l, "k") {
			t.Fatalf("host %d decides from the window as if alone at the end, with two others writing the key", i)
		}

	}
}

// A single host keeps an idle key's lease while its own counts weigh in the
// window (a new lease would take them for another host's), and drops it
// once they have slid out.
func TestHybridSingleHostIdleKey(t *testing.T) {
	f := newFixture(t)
	const limit = 20
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: time.Second,
		Hybrid: &Hybrid{SyncInterval: 100 * time.Millisecond, MaxLease: SingleLease(limit), Share: 1}}
	l := f.limiter(t, Config{Rules: []Rule{rule}, SyncEvery: -1})
	for range 5 {
		allow(t, l, "k")
	}
	f.advance(1100 * time.Millisecond) // its 5 weigh as the previous window
	l.Sync(context.Background())       // reports them and renews the lease
	f.advance(200 * time.Millisecond)  // the lease expired
	l.Sync(context.Background())       // finds it idle: kept
	if !allow(t, l, "k").Decision.Allowed || foreignMode(l, "k") {
		t.Fatalf("an idle key's return: foreign mode %v, want its own counts recognised", foreignMode(l, "k"))
	}
	f.advance(2500 * time.Millisecond) // every count slid out
	l.Sync(context.Background())       // reports the last one (its window has slid out: dropped)
	f.advance(200 * time.Millisecond)  // the lease that flush renewed expired
	l.Sync(context.Background())
	h := l.hybrid[0]
	h.mu.Lock()
	n := len(h.leases)
	h.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d leases kept after their counts slid out of the window, want 0", n)
	}
}

// A host restarted or reloaded: a new limiter on the same keys takes over
// mid-window, and the old one flushes its unsynced counts a few steps
// later, after the new one's first syncs (as a reload closes the old proxy
// after ShutdownTimeout). The new host finds the old one's counts, which it
// cannot tell from another host's, so the key decides with fixed grants
// until they slide out of the window (two windows at most), then from the
// window again. The old counts were admitted before it took the key over:
// it neither counts them as another host's nor warns. Every admission is
// within the limit + lease (what the new host cannot see until the old
// flushes) until two windows after that flush, and within the limit after.
func TestHybridSingleHostRestart(t *testing.T) {
	f := newFixture(t)
	const limit, window = 20, time.Second
	lease := SingleLease(limit)
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: window,
		Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: lease, Share: 1}}
	const stepsPerWindow = int(window / (50 * time.Millisecond))
	const restartAt, closeAt = 50, 56 // 2.5 s, 2.8 s: between two flushes
	old := f.limiter(t, Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(), Rules: []Rule{rule}, SyncEvery: -1})
	reg, logs := prometheus.NewRegistry(), &testenv.SyncBuffer{}
	var nu *Limiter
	last := -1 // the last step at which the new host decided with fixed grants
	hosts := func(s int) []*Limiter {
		if s < restartAt {
			return []*Limiter{old}
		}
		if nu == nil {
			nu = f.limiter(t, Config{Client: f.srv.Client(t), Registerer: reg, Rules: []Rule{rule}, SyncEvery: -1,
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
		}
		if s == closeAt {
			old.Close() // flushes what it admitted since its last sync
		}
		if foreignMode(nu, "k") {
			last = s
		}
		return []*Limiter{nu}
	}
	bound := func(s int) int64 {
		if s < closeAt+2*stepsPerWindow {
			return limit + lease
		}
		return limit
	}
	steps := offered(200)
	admitted, _, _ := hybridTimeline(t, f, hosts, window, bound, time.Second, steps)
	n := foreignCounts(t, reg, "hot")
	t.Logf("admitted %d over 10 s, the new host from 2.5 s, the old one flushed at 2.8 s; the new host decided with fixed grants until %.2f s; %.0f foreign counts",
		admitted, float64(last+1)/float64(stepsPerWindow), n)
	if last < restartAt || last >= closeAt+2*stepsPerWindow+stepsPerWindow {
		t.Fatalf("fixed grants until step %d, want from the restart (step %d) to at most two windows and a sync after the old host's flush (step %d)",
			last, restartAt, closeAt+3*stepsPerWindow)
	}
	if foreignMode(nu, "k") || n != 0 || strings.Contains(logs.String(), foreignWarning) {
		t.Fatalf("restarted host: foreign mode at the end %v, %.0f foreign counts (want 0: the old host's were admitted before); log:\n%s",
			foreignMode(nu, "k"), n, logs)
	}
}

// Three hosts share a key (share 3, the policy's default lease for hosts: 3,
// ⌈count ÷ 30⌉): over 10 windows of bursty traffic dealt round-robin they
// never exceed the sliding window at limit + (hosts − 1) × lease over their
// true admissions, admit at least the limit's worth, and Redis counts
// every admission.
func TestHybridThreeHosts(t *testing.T) {
	f := newFixture(t)
	const limit, hosts, window = 60, 3, time.Second
	const lease = (limit + 10*hosts - 1) / (10 * hosts)
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: window,
		Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: lease, Share: hosts}}
	var ls []*Limiter
	for range hosts {
		ls = append(ls, f.limiter(t, Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(),
			Rules: []Rule{rule}, SyncEvery: -1}))
	}
	// 3 × the single host's clumps: about 3.5× the limit.
	base := offered(200)
	steps := make([]int, len(base))
	for i, c := range base {
		steps[i] = 3 * c
	}
	admitted, _, _ := hybridTimeline(t, f, always(ls), window, always[int64](limit+(hosts-1)*lease), time.Second, steps)
	t.Logf("admitted %d over 10 s (%d windows of %d; bound %d per window)", admitted, 10, limit, limit+(hosts-1)*lease)
	if admitted < 8*limit {
		t.Fatalf("admitted %d in 10 windows of %d: leases wasted the quota", admitted, limit)
	}
}

// TestHybridGrantReset: a fixed grant's first admission in a fresh window
// reports the reset the Redis-backed sliding window reports after the
// same charge (it reported 0: the lease script took the reset before the
// request's own charge).
func TestHybridGrantReset(t *testing.T) {
	f := newFixture(t)
	f.script.Advance(1234 * time.Second) // a position inside the hour
	remote := Rule{Name: "remote", Algorithm: SlidingWindow, Limit: 100, Window: time.Hour}
	hl := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Rules: []Rule{hybridRuleFor(100)}, SyncEvery: -1})
	rl := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Rules: []Rule{remote}})
	h, err := hl.AllowN(context.Background(), "fresh-h", 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := rl.AllowN(context.Background(), "fresh-r", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Decision.Allowed || !r.Decision.Allowed || h.Decision.Reset != r.Decision.Reset || h.Decision.Reset == 0 {
		t.Errorf("first admission in a fresh window: hybrid %+v, redis %+v; want the same non-zero reset", h.Decision, r.Decision)
	}
}
