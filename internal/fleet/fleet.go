// Package fleet is Edgeguard's fleet mode: several edge hosts enforce one
// policy through a shared Redis (or Redis Cluster). Hosts share their
// run-time deny/allow entries through a bounded Redis stream plus a
// snapshot hash, and split each scope: fleet aggregate budget in
// proportion to demand, published per interval under keys with a TTL. The
// package talks to Redis and computes; the daemon owns the data plane and
// is reached through two small interfaces, ListSink and Aggregates. See
// docs/fleet.md.
package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/control"
)

// ListSink is the daemon's side of the shared lists.
type ListSink interface {
	// ApplyRemote applies other hosts' entries (additions and removals)
	// with one write of the lists. With replace, entries are the whole
	// remote set (a snapshot): remote entries not among them go. It
	// returns the entries the daemon's own checks refused (width,
	// lists.protected), each with why, and how many remote entries the
	// host holds now.
	ApplyRemote(entries []ListEntry, replace bool) (remote int, refused []Refusal, err error)
	// Local returns this host's own run-time entries (not those it got
	// from the fleet) as additions.
	Local() []ListEntry
}

// Refusal is an entry the daemon refused.
type Refusal struct {
	Entry ListEntry
	Err   error
}

// AggCounter is one scope: fleet aggregate instance's cumulative counters.
type AggCounter struct {
	// Key names the aggregate the same way on every host.
	Key             string
	Passed, Dropped uint64 // packets since the instance was first counted
	// PassedBytes and DroppedBytes are the same packets' bytes.
	PassedBytes, DroppedBytes uint64
	// Budget is the policy's packet budget for it, packets/s; ByteBudget
	// its byte budget, bytes/s. Zero: the rule has no budget of that
	// dimension to share.
	Budget, ByteBudget float64
}

// Share is this host's share of one aggregate's budget.
type Share struct {
	Key         string
	Budget      float64 // the policy's, packets/s (0: no packet budget)
	Rate        float64 // this host's share, packets/s
	Demand      float64 // own offered rate, packets/s
	FleetDemand float64
	// The byte dimension, the same way in bytes/s (ByteBudget 0: no byte
	// budget).
	ByteBudget, ByteRate, ByteDemand, FleetByteDemand float64
	Hosts                                             int
	Static                                            bool // Redis unreachable: budget ÷ hosts
}

// Fraction is Rate / Budget.
func (s Share) Fraction() float64 {
	if s.Budget <= 0 {
		return 1
	}
	return s.Rate / s.Budget
}

// ByteFraction is ByteRate / ByteBudget.
func (s Share) ByteFraction() float64 {
	if s.ByteBudget <= 0 {
		return 1
	}
	return s.ByteRate / s.ByteBudget
}

// Aggregates is the daemon's side of fleet-wide budgets.
type Aggregates interface {
	// FleetCounters returns the counters of every scope: fleet aggregate
	// instance the data plane counts.
	FleetCounters() ([]AggCounter, error)
	// ApplyShares writes this host's shares, each in force until expires
	// (a crashed daemon's shares lapse and the policy's budgets return).
	ApplyShares(shares []Share, expires time.Time) error
}

// Options configure a Fleet.
type Options struct {
	Name     string
	Host     string
	Interval time.Duration
	// Floor is the fraction of budget ÷ hosts every live host gets.
	Floor  float64
	Client redis.UniversalClient
	Logger *slog.Logger
	// Lists, when set, shares the lists.
	Lists ListSink
	// Aggregates, when set, shares the scope: fleet budgets.
	Aggregates Aggregates
	// Now is the clock (time.Now in production).
	Now func() time.Time
}

// Bounds of what the fleet keeps and reads.
const (
	// streamMaxLen bounds the list stream (approximate trimming, so
	// Redis may keep a little more).
	streamMaxLen = 10_000
	// maxSnapshot bounds the snapshot hash: additions beyond it are
	// refused (the data plane's list table is 65,536 entries by default).
	maxSnapshot = 65_536
	// readBatch is the stream entries one read returns at most.
	readBatch = 1000
	// maxMembers bounds the member list read.
	maxMembers = 1024
	// deadAfter is how many intervals a silent host (no heartbeat) still
	// counts; its published demands are ignored after that, and its keys
	// expire.
	deadAfter = 3
	// keepActive is how many intervals an aggregate that saw no traffic
	// keeps its share (and keeps being published) before it is dropped.
	keepActive = 30
	// resyncEvery: a full snapshot reload every so many intervals
	// repairs anything a reader missed (a trimmed stream).
	resyncEvery = 60
	// topShares is how many shares status shows.
	topShares = 20
)

// Fleet runs the fleet's two loops: lists (follow the stream, publish this
// host's changes) and shares (heartbeat, publish demand, take shares).
type Fleet struct {
	o     Options
	log   *slog.Logger
	k     keys
	pub   chan ListEntry
	kick  chan struct{}
	stats *metrics

	mu sync.Mutex // guards what follows
	st state
}

// state is what status and metrics show.
type state struct {
	redisUp    bool
	fallback   bool
	lastSync   time.Time
	syncs      uint64
	lastErr    string
	members    []control.FleetMember
	shares     []Share
	active     int
	listSynced bool
	lastChange time.Time
	lag        time.Duration
	remote     int
}

type keys struct {
	stream, snap, members, aggPrefix string
}

// newKeys names the fleet's keys. The list stream, the snapshot and the
// member set share the {name} hash tag (one cluster slot: the snapshot
// and the stream are written in one transaction); each aggregate's key is
// tagged by itself, so a Redis Cluster spreads them over its nodes.
func newKeys(name string) keys {
	base := "eg:fleet:{" + name + "}:"
	return keys{stream: base + "lists", snap: base + "lists:snap", members: base + "members",
		aggPrefix: "eg:fleet:" + name + ":agg:"}
}

func (k keys) agg(key string) string { return k.aggPrefix + "{" + key + "}" }

// New returns a fleet; Run starts it.
func New(o Options) (*Fleet, error) {
	if o.Client == nil || o.Name == "" || o.Host == "" || o.Interval <= 0 {
		return nil, fmt.Errorf("fleet: name, host, interval and a redis client are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Fleet{o: o, log: o.Logger, k: newKeys(o.Name), pub: make(chan ListEntry, 1024),
		kick: make(chan struct{}, 1), stats: newMetrics(), st: state{redisUp: true}}, nil
}

// Run runs the loops until ctx ends, then closes the client.
func (f *Fleet) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if f.o.Lists != nil {
		wg.Add(2)
		go func() { defer wg.Done(); f.followLists(ctx) }()
		go func() { defer wg.Done(); f.publishLists(ctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); f.runShares(ctx) }()
	wg.Wait()
	f.o.Client.Close()
}

// Publish queues this host's list change for the fleet. It never blocks:
// with the queue full the change is dropped here, and the next resync
// (reconnect, or every resyncEvery intervals) publishes the host's
// entries again.
func (f *Fleet) Publish(e ListEntry) {
	if f.o.Lists == nil {
		return
	}
	e.Host = f.o.Host
	if e.At.IsZero() {
		e.At = f.o.Now()
	}
	select {
	case f.pub <- e:
	default:
		f.stats.publishDropped.Inc()
	}
}

// setRedis records Redis reachability and logs each transition once.
func (f *Fleet) setRedis(err error) {
	f.mu.Lock()
	was := f.st.redisUp
	f.st.redisUp = err == nil
	if err != nil {
		f.st.lastErr = err.Error()
	}
	f.mu.Unlock()
	switch {
	case was && err != nil:
		f.stats.redisDown.Inc()
		f.log.Warn("fleet: redis unreachable: static shares (budget ÷ fleet size) until it returns; lists as last synced",
			"err", err)
	case !was && err == nil:
		f.log.Info("fleet: redis reachable again: resyncing lists and shares")
	}
}

// Status is `edgectl fleet status`.
func (f *Fleet) Status() control.FleetStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := control.FleetStatus{
		Enabled: true, Name: f.o.Name, Host: f.o.Host, Interval: control.Duration(f.o.Interval),
		RedisUp: f.st.redisUp, Fallback: f.st.fallback, LastSync: f.st.lastSync, Syncs: f.st.syncs, LastError: f.st.lastErr,
		Members: append([]control.FleetMember(nil), f.st.members...), ActiveAggregates: f.st.active,
		Lists: control.FleetList{
			Enabled: f.o.Lists != nil, Synced: f.st.listSynced, LastChange: f.st.lastChange,
			Lag: control.Duration(f.st.lag), Remote: f.st.remote,
			Published: uint64(counterValue(f.stats.published)), Applied: uint64(counterValue(f.stats.applied)),
			Refused: uint64(counterValue(f.stats.refused)), Malformed: uint64(counterValue(f.stats.malformed)),
		},
	}
	for _, s := range f.st.shares {
		st.Shares = append(st.Shares, control.FleetShare{Aggregate: s.Key, Budget: s.Budget, Share: s.Rate,
			Fraction: s.Fraction(), Demand: s.Demand, FleetDemand: s.FleetDemand, ByteBudget: s.ByteBudget, ByteShare: s.ByteRate,
			ByteDemand: s.ByteDemand, FleetByteDemand: s.FleetByteDemand, Hosts: s.Hosts, Static: s.Static})
	}
	return st
}

// sleep waits d or until ctx ends; false when it ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
