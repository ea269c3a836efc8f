package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// aggState is what the shares loop remembers of one aggregate.
type aggState struct {
	passed, dropped   uint64
	passedB, droppedB uint64    // bytes
	at                time.Time // when the counters were read
	lastActive        time.Time // last interval with traffic
	demand, pass      float64   // rates over the last interval, packets/s
	demandB, passB    float64   // bytes/s
	budget, byteB     float64   // the policy's packets/s and bytes/s
}

// runShares runs one sync per interval until ctx ends.
func (f *Fleet) runShares(ctx context.Context) {
	aggs := map[string]*aggState{}
	hosts := 1
	t := time.NewTicker(f.o.Interval)
	defer t.Stop()
	for {
		hosts = f.syncShares(ctx, aggs, hosts)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// syncShares is one interval: read the counters, heartbeat, publish this
// host's demand for its active aggregates and read the others', take the
// shares. Without Redis every active aggregate gets the static share. It
// returns the fleet size to remember.
func (f *Fleet) syncShares(ctx context.Context, aggs map[string]*aggState, hosts int) int {
	now := f.o.Now()
	active := f.measure(aggs, now)
	ctx, cancel := context.WithTimeout(ctx, 2*f.o.Interval)
	defer cancel()
	members, others, err := f.exchange(ctx, now, active, aggs)
	f.setRedis(err)
	var shares []Share
	if err != nil {
		f.stats.syncs.WithLabelValues("failed").Inc()
		for _, k := range active {
			a := aggs[k]
			shares = append(shares, Share{Key: k, Budget: a.budget, Rate: StaticShare(a.budget, hosts), Demand: a.demand,
				FleetDemand: a.demand, ByteBudget: a.byteB, ByteRate: StaticShare(a.byteB, hosts), ByteDemand: a.demandB,
				FleetByteDemand: a.demandB, Hosts: hosts, Static: true})
		}
	} else {
		f.stats.syncs.WithLabelValues("ok").Inc()
		hosts = max(len(members), 1)
		for _, k := range active {
			a := aggs[k]
			fleet, fleetB := a.demand, a.demandB
			n := 1
			for _, o := range others[k] {
				fleet += o.Demand
				fleetB += o.Bytes
				n++
			}
			shares = append(shares, Share{Key: k, Budget: a.budget, Demand: a.demand, FleetDemand: fleet, Hosts: max(hosts, n),
				Rate:       ShareOf(a.budget, f.o.Floor, hosts, f.o.Host, a.demand, others[k]),
				ByteBudget: a.byteB, ByteDemand: a.demandB, FleetByteDemand: fleetB,
				ByteRate: ShareOf(a.byteB, f.o.Floor, hosts, f.o.Host, a.demandB, byteDemands(others[k]))})
		}
	}
	if f.o.Aggregates != nil && len(shares) > 0 {
		if aerr := f.o.Aggregates.ApplyShares(shares, now.Add(deadAfter*f.o.Interval)); aerr != nil {
			f.log.Error("fleet: shares not written to the data plane", "err", aerr)
		}
	}
	slices.SortFunc(shares, func(a, b Share) int {
		if a.FleetDemand != b.FleetDemand {
			if a.FleetDemand > b.FleetDemand {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	f.stats.active.Set(float64(len(active)))
	f.stats.members.Set(float64(hosts))
	f.mu.Lock()
	f.st.fallback = err != nil
	f.st.syncs++
	if err == nil {
		f.st.lastSync = now
		f.st.members = members
	}
	f.st.active = len(active)
	f.st.shares = shares[:min(len(shares), topShares)]
	f.mu.Unlock()
	if err == nil {
		f.stats.lastSync.Set(float64(now.UnixMilli()) / 1000)
	}
	f.stats.fallback.Set(boolGauge(err != nil))
	return hosts
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// measure reads the counters and returns the active aggregates (traffic
// within keepActive intervals), sorted. aggs holds at most one state per
// instance the data plane counts (its agg_stats table is bounded).
func (f *Fleet) measure(aggs map[string]*aggState, now time.Time) []string {
	if f.o.Aggregates == nil {
		return nil
	}
	cs, err := f.o.Aggregates.FleetCounters()
	if err != nil {
		f.log.Error("fleet: read aggregate counters", "err", err)
		cs = nil
	}
	seen := map[string]bool{}
	for _, c := range cs {
		seen[c.Key] = true
		a, ok := aggs[c.Key]
		if !ok {
			// First sight: no rate yet (the counters may hold traffic
			// from before); it counts as active from now.
			aggs[c.Key] = &aggState{passed: c.Passed, dropped: c.Dropped, passedB: c.PassedBytes, droppedB: c.DroppedBytes,
				at: now, lastActive: now, budget: c.Budget, byteB: c.ByteBudget}
			continue
		}
		a.budget, a.byteB = c.Budget, c.ByteBudget
		dt := now.Sub(a.at).Seconds()
		if c.Passed < a.passed || c.Dropped < a.dropped || c.PassedBytes < a.passedB || c.DroppedBytes < a.droppedB {
			// Evicted and counted again from zero: a restart.
			a.passed, a.dropped, a.passedB, a.droppedB = 0, 0, 0, 0
		}
		if dt > 0 {
			dp, dd := c.Passed-a.passed, c.Dropped-a.dropped
			a.pass = float64(dp) / dt
			a.demand = float64(dp+dd) / dt
			a.passB = float64(c.PassedBytes-a.passedB) / dt
			a.demandB = float64(c.PassedBytes-a.passedB+c.DroppedBytes-a.droppedB) / dt
			if dp+dd > 0 {
				a.lastActive = now
			}
		}
		a.passed, a.dropped, a.passedB, a.droppedB, a.at = c.Passed, c.Dropped, c.PassedBytes, c.DroppedBytes, now
	}
	var out []string
	for k, a := range aggs {
		if !seen[k] {
			a.demand, a.pass, a.demandB, a.passB = 0, 0, 0, 0
		}
		if now.Sub(a.lastActive) > keepActive*f.o.Interval {
			// Idle: no longer published. While the data plane still
			// counts the instance its state stays, as the baseline its
			// counters must move from to make it active again (forgotten,
			// it would come back at the next sync as a first sight,
			// active for keepActive more intervals, and so never go);
			// gone from the counters too (LRU eviction), it goes.
			if !seen[k] {
				delete(aggs, k)
			}
			continue
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// exchange is one pipelined round trip: heartbeat, drop dead members,
// read the members, and per active aggregate publish this host's demand
// ("demand passed unix_ms demand_bytes passed_bytes": packets/s, then
// bytes/s) and read every host's. Published fields of
// hosts that are not live members, or older than deadAfter intervals, are
// ignored; each aggregate key expires deadAfter intervals after the last
// host published to it.
func (f *Fleet) exchange(ctx context.Context, now time.Time, active []string, aggs map[string]*aggState) (
	[]control.FleetMember, map[string][]HostDemand, error) {
	c := f.o.Client
	ttl := deadAfter * f.o.Interval
	cutoff := now.Add(-ttl)
	// Members first, in a slot of their own (no cross-slot pipeline
	// needed in a cluster for this part).
	var mem *redis.ZSliceCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, f.k.members, redis.Z{Score: float64(now.UnixMilli()), Member: f.o.Host})
		p.ZRemRangeByScore(ctx, f.k.members, "-inf", "("+strconv.FormatInt(cutoff.UnixMilli(), 10))
		p.PExpire(ctx, f.k.members, 10*ttl)
		mem = p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: f.k.members, Start: 0, Stop: maxMembers - 1})
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("fleet heartbeat: %w", err)
	}
	live := map[string]bool{}
	var members []control.FleetMember
	for _, z := range mem.Val() {
		h, _ := z.Member.(string)
		if !policy.ValidHostID(h) {
			continue
		}
		live[h] = true
		members = append(members, control.FleetMember{Host: h, LastSeen: time.UnixMilli(int64(z.Score)).UTC()})
	}
	if len(active) == 0 {
		return members, nil, nil
	}
	// In batches: one pipeline's replies must arrive within the read
	// timeout.
	reads := make([]*redis.MapStringStringCmd, len(active))
	for lo := 0; lo < len(active); lo += exchangeBatch {
		hi := min(lo+exchangeBatch, len(active))
		_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				k := active[i]
				a := aggs[k]
				key := f.k.agg(k)
				p.HSet(ctx, key, f.o.Host, fmt.Sprintf("%.3f %.3f %d %.3f %.3f", a.demand, a.pass, now.UnixMilli(), a.demandB, a.passB))
				p.PExpire(ctx, key, ttl)
				reads[i] = p.HGetAll(ctx, key)
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("fleet demand exchange: %w", err)
		}
	}
	others := map[string][]HostDemand{}
	for i, k := range active {
		for h, v := range reads[i].Val() {
			if h == f.o.Host || !live[h] {
				continue
			}
			d, at, ok := parseDemand(v)
			if !ok {
				f.stats.malformed.Inc()
				continue
			}
			if at.Before(cutoff) {
				continue
			}
			d.Host = h
			others[k] = append(others[k], d)
		}
	}
	return members, others, nil
}

// exchangeBatch is how many aggregates one pipeline carries (3 commands
// each).
const exchangeBatch = 256

// maxDemand bounds a published packet demand (packets/s), maxByteDemand
// a byte demand (bytes/s): a hostile or broken value above it is
// malformed, not a reason to starve this host.
const (
	maxDemand     = 1e12
	maxByteDemand = 1e15
)

// parseDemand reads "demand passed unix_ms demand_bytes passed_bytes" as
// published by exchange (Host left empty).
func parseDemand(v string) (HostDemand, time.Time, bool) {
	parts := strings.Fields(v)
	if len(v) > 128 || len(parts) != 5 {
		return HostDemand{}, time.Time{}, false
	}
	var f [4]float64
	for i, j := range []int{0, 1, 3, 4} {
		x, err := strconv.ParseFloat(parts[j], 64)
		bound := maxDemand
		if i >= 2 {
			bound = maxByteDemand
		}
		if err != nil || !(x >= 0 && x <= bound) {
			return HostDemand{}, time.Time{}, false
		}
		f[i] = x
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || ms <= 0 {
		return HostDemand{}, time.Time{}, false
	}
	return HostDemand{Demand: f[0], Bytes: f[2]}, time.UnixMilli(ms), true
}
