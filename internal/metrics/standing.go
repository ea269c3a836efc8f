package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// StandingSource is what an XDPSource may also offer: the standing table's
// class counters and events, and which aggregate kinds are congested. The
// collector exports them when its source implements it.
type StandingSource interface {
	ClassCounters() (maps.ClassCounters, error)
	StandingCounts() (maps.StandingCounts, error)
	// Congested reports, per aggregate kind (prefix, asn, global), whether
	// it is refusing new sources now.
	Congested() map[string]bool
	// CongestedInstances counts, per aggregate kind, the single
	// aggregates (an ASN, a prefix) refusing sources now.
	CongestedInstances() map[string]int
}

// ReadStanding is the read label of edgeguard_scrape_errors_total for the
// standing counters.
const ReadStanding = "standing"

func (c *XDPCollector) collectStanding(ch chan<- prometheus.Metric, src StandingSource) error {
	classes := prometheus.NewDesc("edgeguard_xdp_class_packets_total",
		"Packets at congested aggregate buckets, by aggregate kind, source class (standing; unknown: admitted below the reserve band without a lookup), outcome and mode (dry-run: would drop).",
		[]string{"aggregate", "class", "outcome", "mode"}, nil)
	events := prometheus.NewDesc("edgeguard_standing_events_total",
		"Standing table changes made by the data plane: created, table_full (a new source not entered), established, penalised, validated_tcp (a completed TCP handshake).",
		[]string{"event"}, nil)
	congested := prometheus.NewDesc("edgeguard_aggregate_congested",
		"1 while an aggregate kind refuses new sources (its reserve is in use), else 0.",
		[]string{"aggregate"}, nil)
	instances := prometheus.NewDesc("edgeguard_aggregate_congested_instances",
		"Aggregate instances (one ASN, one prefix, a rule's whole aggregate, the global bucket) refusing sources now, by kind, from the drop samples; at most 64 are tracked.",
		[]string{"aggregate"}, nil)
	cc, err := src.ClassCounters()
	if err != nil {
		return err
	}
	ev, err := src.StandingCounts()
	if err != nil {
		return err
	}
	for dry := range cc {
		mode := "enforce"
		if dry == 1 {
			mode = "dry-run"
		}
		for agg := range cc[dry] {
			for cls := range cc[dry][agg] {
				for o := range cc[dry][agg][cls] {
					ch <- prometheus.MustNewConstMetric(classes, prometheus.CounterValue, float64(cc[dry][agg][cls][o].Packets),
						maps.ClassAggName(maps.ClassAgg(agg)), maps.ClassName(maps.Class(cls)), maps.OutcomeName(maps.Outcome(o)), mode)
				}
			}
		}
	}
	for name, v := range map[string]uint64{"created": ev.Created, "table_full": ev.Full, "established": ev.Established,
		"penalised": ev.Penalised, "validated_tcp": ev.Validated, "jumped": ev.Jumped} {
		ch <- prometheus.MustNewConstMetric(events, prometheus.CounterValue, float64(v), name)
	}
	for name, on := range src.Congested() {
		v := 0.0
		if on {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(congested, prometheus.GaugeValue, v, name)
	}
	for name, n := range src.CongestedInstances() {
		ch <- prometheus.MustNewConstMetric(instances, prometheus.GaugeValue, float64(n), name)
	}
	return nil
}
