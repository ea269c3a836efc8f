package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// commandsProcessed is Redis's total_commands_processed.
func commandsProcessed(b *testing.B, c *redis.Client) int64 {
	b.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// BenchmarkFleetSync is one host's share sync (heartbeat, publish and read
// demand) against a real redis-server, by active aggregates. It reports
// the Redis commands one sync costs (counted by the server) and the
// commands per second a host sends at a 1 s interval (at interval T,
// divide by T). The peer in the same run is one PING round trip
// (ns/op of the ping case), to read sync times as round trips.
func BenchmarkFleetSync(b *testing.B) {
	srv := testenv.StartRedis(b)
	admin := srv.Client(b)
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := admin.Ping(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("aggregates=%d", n), func(b *testing.B) {
			clk := &clock{t: time.Now()}
			h := newShareHost(b, srv.Client(b), "a", clk)
			for i := range n {
				h.aggs.offer(fmt.Sprintf("rule 1 asn %d", 64500+i), 1000, 10)
			}
			h.sync() // first sight: no rates yet
			before := commandsProcessed(b, admin)
			syncs := 0
			for b.Loop() {
				clk.add(time.Second)
				for k := range h.aggs.c {
					h.aggs.offer(k, 1000, 10)
				}
				h.sync()
				syncs++
			}
			b.StopTimer()
			cmds := float64(commandsProcessed(b, admin)-before-1) / float64(syncs)
			b.ReportMetric(cmds, "cmds/sync")
			b.ReportMetric(cmds, "cmds/s@1s")
			if h.f.Status().LastError != "" {
				b.Fatalf("sync failed: %s", h.f.Status().LastError)
			}
		})
	}
}

// BenchmarkShareConvergence is the share convergence time: three hosts
// against a real redis-server, on an injected clock, see a flood split
// 90/9/1 of 3,000/s flip to 1/9/90 at a random point of an interval; one
// op is one flip. It reports, in intervals, the time from the flip to the
// first sync at which the host that became busiest (c) holds over 70% of
// the budget (it settles at 84%): the mean, the worst, and the fraction of
// flips that took over 3 intervals. Each host syncs once per interval at
// its own phase, as its ticker does; the cases are phase orders (c last,
// c first, all within 2 ms in a random order), each also with every sync
// delayed by a random 0-30% of an interval, as on a loaded machine. ns/op
// is the real time of one op's syncs (syncs/op; each also publishes the
// aggregates of the ops of the last 30 intervals), to read against
// BenchmarkFleetSync's per-sync cost in the same run.
func BenchmarkShareConvergence(b *testing.B) {
	srv := testenv.StartRedis(b)
	third := time.Second / 3
	for _, c := range []struct {
		name   string
		phase  []time.Duration // a, b, c; nil: within 2 ms, random order
		jitter float64
	}{
		{"phases=0,1/3,2/3", []time.Duration{0, third, 2 * third}, 0},
		{"phases=0,1/3,2/3/jitter=30%", []time.Duration{0, third, 2 * third}, 0.3},
		{"phases=2/3,1/3,0", []time.Duration{2 * third, third, 0}, 0},
		{"phases=2/3,1/3,0/jitter=30%", []time.Duration{2 * third, third, 0}, 0.3},
		{"phases=same", nil, 0},
		{"phases=same/jitter=30%", nil, 0.3},
	} {
		b.Run(c.name, func(b *testing.B) {
			srv.Client(b).FlushAll(context.Background())
			benchConvergence(b, srv.Client, c.phase, c.jitter)
		})
	}
}

func benchConvergence(b *testing.B, client func(testing.TB) *redis.Client, phase []time.Duration, jitter float64) {
	clk := &clock{t: time.Now().Truncate(time.Second)}
	var hosts []*shareHost
	for _, n := range []string{"a", "b", "c"} {
		hosts = append(hosts, newShareHost(b, client(b), n, clk))
	}
	base := clk.Now()
	before, after := []float64{2700, 270, 30}, []float64{30, 270, 2700}
	last := make([]time.Time, len(hosts))
	for i := range last {
		last[i] = base.Add(-time.Second)
	}
	var sum, worst float64
	ops, syncs, over3 := 0, 0, 0
	var k int64 // the interval count on the injected clock, across ops
	rng := uint64(1)
	rand := func() float64 { // a fixed sequence, so runs compare
		rng = rng*6364136223846793005 + 1442695040888963407
		return float64(rng>>11) / (1 << 53)
	}
	type event struct {
		host int
		at   time.Time
	}
	for b.Loop() {
		key := fmt.Sprintf("rule 1 asn %d", 64500+ops)
		start := k
		flip := base.Add(time.Duration(start+3)*time.Second + time.Duration(rand()*float64(time.Second)))
		var followed time.Time
		for ; k < start+10 && followed.IsZero(); k++ {
			tick := base.Add(time.Duration(k) * time.Second)
			evs := make([]event, len(hosts))
			for i := range hosts {
				off := time.Duration(rand() * float64(2*time.Millisecond))
				if phase != nil {
					off = phase[i]
				}
				off += time.Duration(rand() * jitter * float64(time.Second))
				evs[i] = event{i, tick.Add(off)}
			}
			slices.SortFunc(evs, func(x, y event) int { return x.at.Compare(y.at) })
			for _, e := range evs {
				h := hosts[e.host]
				// Packets offered since this host's last sync: the old
				// split before the flip, the new after it.
				span := e.at.Sub(last[e.host]).Seconds()
				oldPart := min(max(flip.Sub(last[e.host]).Seconds(), 0), span)
				n := before[e.host]*oldPart + after[e.host]*(span-oldPart)
				last[e.host] = e.at
				clk.set(e.at)
				h.aggs.offer(key, 1000, uint64(n))
				h.sync()
				syncs++
				if e.host == 2 && e.at.After(flip) && followed.IsZero() && h.aggs.share(key).Fraction() > 0.7 {
					followed = e.at
				}
			}
		}
		if followed.IsZero() {
			b.Fatalf("op %d: c's share did not follow within 7 intervals of the flip", ops)
		}
		took := followed.Sub(flip).Seconds()
		sum += took
		worst = max(worst, took)
		if took > 3 {
			over3++
		}
		ops++
		k += 2 // idle intervals between ops (the aggregate keys differ)
	}
	b.ReportMetric(sum/float64(ops), "intervals-mean")
	b.ReportMetric(worst, "intervals-max")
	b.ReportMetric(float64(over3)/float64(ops), "over-3-intervals")
	b.ReportMetric(float64(syncs)/float64(ops), "syncs/op")
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
