// Package metrics exports the XDP data plane to Prometheus: a collector that
// reads the data plane's counters and tables at scrape time (nothing is
// counted twice, nothing is cached), sums per-CPU values, and keeps going
// when one part of its source fails.
package metrics

import (
	"log/slog"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// XDPSource is what the XDP collector reads at scrape time.
type XDPSource interface {
	// IfaceCounters returns counters by interface name; "other" holds slot 0.
	IfaceCounters() (map[string]maps.Counters, error)
	// RuleCounters returns counters by rule name.
	RuleCounters() (map[string]maps.RuleCounters, error)
	// Tables returns the fill of each table by name (sources, aggregates, lists, ...).
	Tables() (map[string]maps.Occupancy, error)
	// PolicyStatus describes the running policy and its reloads.
	PolicyStatus() PolicyStatus
}

// PolicyStatus describes the running policy and its reloads.
type PolicyStatus struct {
	Generation        uint64    // increments on every successful apply
	LastReloadSuccess bool      // whether the last reload attempt applied
	LastReloadTime    time.Time // zero: never reloaded
	// Reloads counts successful reloads and ReloadFailures failed ones;
	// the two are disjoint, so attempts are their sum.
	Reloads, ReloadFailures uint64
}

// Layer is the value of the layer label on the families shared with the L7
// stage.
const Layer = "xdp"

// RejectedHelp is the help text of rate_limit_rejected_total. It must stay
// byte-identical to internal/l7's, or one registry cannot gather both.
const RejectedHelp = "Requests rejected, by rule and reason."

// ReasonRule is the reason label of rate_limit_rejected_total for packets
// a rule dropped (any of its limits, the global limit, or a drop rule): the
// per-rule counters of the data plane are kept by action, not by reason.
const ReasonRule = "rule"

// Read names: the values of the read label of edgeguard_scrape_errors_total.
const (
	ReadIfaceCounters = "iface_counters"
	ReadRuleCounters  = "rule_counters"
	ReadTables        = "tables"
)

// Indexes of XDPCollector.errors.
const (
	readIface = iota
	readRules
	readTables
	readStanding
	numReads
)

// readName is the read label of an index of XDPCollector.errors.
func readName(i int) string {
	switch i {
	case readIface:
		return ReadIfaceCounters
	case readRules:
		return ReadRuleCounters
	case readStanding:
		return ReadStanding
	}
	return ReadTables
}

// decidedUnderRule reports whether the data plane also counts a packet of
// this reason in its rule's counters (the verdict was taken after the rule
// was found). Drops of these reasons appear in rate_limit_rejected_total
// under the rule; drops of every other reason appear with rule="".
func decidedUnderRule(r maps.Reason) bool {
	switch r {
	case maps.ReasonOK, maps.ReasonSrcLimit, maps.ReasonPrefixLimit, maps.ReasonASNLimit,
		maps.ReasonGlobalLimit, maps.ReasonRuleDrop, maps.ReasonRulePass,
		// A fingerprint and the overrides act on a packet of a rule:
		// the rule's counters have it too.
		maps.ReasonFingerprint, maps.ReasonShieldTighten, maps.ReasonFleetShare, maps.ReasonOverride:
		return true
	}
	return false
}

// dropsBeforeRule reports whether r is a reason that can drop a packet
// before any rule is looked at; rate_limit_rejected_total exports these
// even at zero, so that rate() sees the first drop.
func dropsBeforeRule(r maps.Reason) bool {
	switch r {
	case maps.ReasonDeny, maps.ReasonBadEth, maps.ReasonBadVLAN, maps.ReasonBadIPv4,
		maps.ReasonBadIPv6, maps.ReasonBadL4, maps.ReasonBadIPLen, maps.ReasonICMPFamily:
		return true
	}
	return false
}

// XDPCollector is a prometheus.Collector over an XDPSource.
//
// It is an unchecked collector: Describe sends nothing. The reason is the
// family rate_limit_rejected_total{layer="xdp"}, which internal/l7 also
// emits and describes from its own collector. A registry refuses two
// collectors that describe the same family, and a pedantic registry (the
// one prometheus/testutil uses) refuses a metric whose Desc nobody
// described, so leaving out only that Desc would break whenever no L7
// collector is registered. Unchecked, the collector gathers alone or next
// to the L7 collector in any registry; the registry still checks at gather
// time that names, help, types and label sets agree and that no series is
// duplicated. Each scrape reads the source once, so every family comes
// from the same read.
type XDPCollector struct {
	src XDPSource
	log *slog.Logger

	packets, bytes                  *prometheus.Desc
	rulePackets, ruleBytes          *prometheus.Desc
	tableEntries, tableCapacity     *prometheus.Desc
	generation, lastOK, lastTime    *prometheus.Desc
	reloads, scrapeErrors, rejected *prometheus.Desc
	errors                          [numReads]atomic.Uint64
}

// NewXDPCollector returns a collector reading src at every scrape. A nil
// logger discards; read errors are logged at warning level and counted.
func NewXDPCollector(src XDPSource, log *slog.Logger) *XDPCollector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &XDPCollector{
		src: src,
		log: log,
		packets: prometheus.NewDesc("edgeguard_xdp_packets_total",
			"Packets seen by the XDP program, by interface, verdict action and reason.",
			[]string{"iface", "action", "reason"}, nil),
		bytes: prometheus.NewDesc("edgeguard_xdp_bytes_total",
			"Bytes (whole frames) seen by the XDP program, by interface, verdict action and reason.",
			[]string{"iface", "action", "reason"}, nil),
		rulePackets: prometheus.NewDesc("edgeguard_xdp_rule_packets_total",
			"Packets that reached a rule, by rule and verdict action.",
			[]string{"rule", "action"}, nil),
		ruleBytes: prometheus.NewDesc("edgeguard_xdp_rule_bytes_total",
			"Bytes of the packets that reached a rule, by rule and verdict action.",
			[]string{"rule", "action"}, nil),
		tableEntries: prometheus.NewDesc("edgeguard_table_entries",
			"Entries held in a data plane table.", []string{"table"}, nil),
		tableCapacity: prometheus.NewDesc("edgeguard_table_capacity_entries",
			"Entries a data plane table can hold (fixed at load time).", []string{"table"}, nil),
		generation: prometheus.NewDesc("edgeguard_policy_generation",
			"Policy generation running; increments on every successful apply.", nil, nil),
		lastOK: prometheus.NewDesc("edgeguard_policy_last_reload_success",
			"1 if the last policy reload applied, 0 if it failed; absent before the first reload.", nil, nil),
		lastTime: prometheus.NewDesc("edgeguard_policy_last_reload_timestamp_seconds",
			"Unix time of the last policy reload attempt; absent before the first reload.", nil, nil),
		reloads: prometheus.NewDesc("edgeguard_policy_reloads_total",
			"Policy reloads, by result (success or failure).", []string{"result"}, nil),
		scrapeErrors: prometheus.NewDesc("edgeguard_scrape_errors_total",
			"Failed reads of the data plane during scrapes, by what was read.", []string{"read"}, nil),
		rejected: prometheus.NewDesc("rate_limit_rejected_total", RejectedHelp,
			[]string{"layer", "rule", "reason"}, nil),
	}
}

// Describe implements prometheus.Collector. It sends nothing, which makes
// the collector unchecked (see XDPCollector).
func (c *XDPCollector) Describe(chan<- *prometheus.Desc) {}

func (c *XDPCollector) failed(read int, err error) {
	c.errors[read].Add(1)
	c.log.Warn("metrics: read of the data plane failed; its metrics are left out of this scrape",
		"read", readName(read), "err", err)
}

// Collect implements prometheus.Collector. Each part of the source is read
// once; a part that fails is left out and counted in
// edgeguard_scrape_errors_total, and the rest is exported.
func (c *XDPCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	ifaces, err := c.src.IfaceCounters()
	if err != nil {
		c.failed(readIface, err)
	} else {
		var total maps.Counters
		for _, name := range sortedKeys(ifaces) {
			cs := ifaces[name]
			for a := range cs {
				act := maps.ActionName(maps.Action(a))
				for r := range cs[a] {
					reason := maps.ReasonName(maps.Reason(r))
					counter(c.packets, cs[a][r].Packets, name, act, reason)
					counter(c.bytes, cs[a][r].Bytes, name, act, reason)
					total[a][r].Packets += cs[a][r].Packets
					total[a][r].Bytes += cs[a][r].Bytes
				}
			}
		}
		drops := total[maps.ActDrop]
		for r := range drops {
			reason := maps.Reason(r)
			if decidedUnderRule(reason) {
				continue
			}
			if drops[r].Packets != 0 || dropsBeforeRule(reason) {
				counter(c.rejected, drops[r].Packets, Layer, "", maps.ReasonName(reason))
			}
		}
	}

	rules, err := c.src.RuleCounters()
	if err != nil {
		c.failed(readRules, err)
	} else {
		for _, name := range sortedKeys(rules) {
			rc := rules[name]
			for a := range rc {
				act := maps.ActionName(maps.Action(a))
				counter(c.rulePackets, rc[a].Packets, name, act)
				counter(c.ruleBytes, rc[a].Bytes, name, act)
			}
			counter(c.rejected, rc[maps.ActDrop].Packets, Layer, name, ReasonRule)
		}
	}

	tables, err := c.src.Tables()
	if err != nil {
		c.failed(readTables, err)
	} else {
		for _, name := range sortedKeys(tables) {
			gauge(c.tableEntries, float64(tables[name].Entries), name)
			gauge(c.tableCapacity, float64(tables[name].Capacity), name)
		}
	}

	st := c.src.PolicyStatus()
	gauge(c.generation, float64(st.Generation))
	if !st.LastReloadTime.IsZero() {
		ok := 0.0
		if st.LastReloadSuccess {
			ok = 1
		}
		gauge(c.lastOK, ok)
		t := st.LastReloadTime
		gauge(c.lastTime, float64(t.Unix())+float64(t.Nanosecond())/1e9)
	}
	counter(c.reloads, st.Reloads, "success")
	counter(c.reloads, st.ReloadFailures, "failure")

	if ss, ok := c.src.(StandingSource); ok {
		if err := c.collectStanding(ch, ss); err != nil {
			c.failed(readStanding, err)
		}
	}
	for i := range numReads {
		counter(c.scrapeErrors, c.errors[i].Load(), readName(i))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
