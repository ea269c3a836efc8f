package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// committed is a policy generation the data plane runs now, as its
// subscribers are told of it.
type committed struct {
	seq uint64 // the daemon's generation (status, metrics): 1 is the start's
	run running
	at  time.Time
	// l7commit makes the L7 stage prepared for this generation live (it
	// cannot fail); nil when none was prepared (the tests' data-plane
	// commits).
	l7commit func()
}

// subscriber is a subsystem told of each committed generation. follow
// brings the subsystem to what the generation asks for; an error says
// what did not follow, and the subsystem keeps what it ran before as far
// as it can (each follow says how).
type subscriber struct {
	name   string
	follow func(ctx context.Context, c committed) error
	// mayFail: follow can return an error (the others only take what
	// they report or sweep by).
	mayFail bool
}

// subscribers are the subsystems told of each committed generation, in
// this order (docs/architecture.md, "one policy change"):
//
//  1. syn: the SYN path is part of the packet path the generation just
//     made live (the same interfaces, the same services); it goes first so
//     the data plane is whole before anything reads it.
//  2. l7: the L7 stage prepared for this generation (its listener bound,
//     its proxy built, before the commit) is made live.
//  3. standing: the congestion watch names congested instances by the
//     generation's rules and the sweep keeps entries by its standing
//     settings; it writes only the standing table (entries the data plane
//     and the L7 classes read as they always do), and cannot fail.
//  4. capture: the capture streams name their frames' rules and describe
//     the sampling by the generation; it writes nothing and cannot fail.
//  5. sampler: the sample readers report the generation's sampler
//     settings (edgectl stats); it writes nothing and cannot fail.
//  6. counters: the counter readings take the generation's rules'
//     counters; it writes nothing and cannot fail.
//  7. shield: it re-reads the new generation's rule slots and shapes and
//     may change overrides and fingerprints; it goes before fleet and BGP,
//     which share its aggregate watches (fleet) and announce its
//     fingerprints (BGP), so they see the shield as this generation has it.
//  8. fleet: budgets and lists shared through Redis; after the shield, so
//     a watch both need is handed over, never dropped between them.
//  9. bgp: announcements leave the host: the most visible effect goes
//     last, once everything it reports on (the shield's fingerprints, the
//     destinations) follows the generation; a new speaker adopts the
//     shield's actions in force.
//
// Nobody polls for a new policy: this list is the only way a generation
// reaches a subsystem, the start's first included.
func (d *Daemon) subscribers() []subscriber {
	return []subscriber{
		{"syn", d.syn.follow, true},
		{"l7", followL7, true},
		{"standing", d.standing.follow, false},
		{"capture", d.capture.follow, false},
		{"sampler", d.samples.follow, false},
		{"counters", d.counters.follow, false},
		{"shield", d.shield.follow, true},
		{"fleet", d.fleet.follow, true},
		{"bgp", d.bgp.follow, true},
	}
}

// publish tells each subscriber of c, in order. The generation is
// committed before (the data plane runs it, status says so): a subscriber
// that fails cannot take that back. It keeps what it ran before as far as
// it can (syn: the limiter runs alone; fleet: a fleet that cannot be built
// leaves the running one as it was; bgp: a password file that does not
// read leaves the sessions as they were, retried each second), the other
// subscribers are still told, and the failure is logged, counted
// (edgeguard_policy_subscriber_failures_total), kept in status (last
// reload's problems) and returned for the apply's answer. Caller holds
// changeMu (or is starting), not mu.
func (d *Daemon) publish(ctx context.Context, c committed) []string {
	var problems []string
	for _, s := range d.subscribers() {
		if err := s.follow(ctx, c); err != nil {
			d.subFailures.WithLabelValues(s.name).Inc()
			d.log.Error("policy applied; a part did not follow it", "part", s.name, "generation", c.seq, "err", err)
			problems = append(problems, fmt.Sprintf("%s: %v", s.name, err))
		}
	}
	if len(problems) > 0 {
		d.mu.Lock()
		if d.generation == c.seq {
			d.lastReload.Problems = problems
		}
		d.mu.Unlock()
	}
	return problems
}

// newSubscriberFailures is edgeguard_policy_subscriber_failures_total,
// with a zero for each subscriber that may fail.
func newSubscriberFailures(subs []subscriber) *prometheus.CounterVec {
	var names []string
	for _, s := range subs {
		if s.mayFail {
			names = append(names, s.name)
		}
	}
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_policy_subscriber_failures_total",
		Help: "Committed policy generations a part (" + strings.Join(names, ", ") + ") did not follow; the policy applied, the part kept what it ran (status: last reload's problems).",
	}, []string{"subscriber"})
	for _, n := range names {
		v.WithLabelValues(n)
	}
	return v
}

// followL7 makes the L7 stage prepared for the generation live.
func followL7(_ context.Context, c committed) error {
	if c.l7commit != nil {
		c.l7commit()
	}
	return nil
}
