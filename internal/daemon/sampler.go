package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/control"
)

// The 1-in-N sampler's counters (docs/metrics.md, "Sampler"): the data
// plane's per-CPU counters summed, and the daemon's reading of the ring
// buffer.

// samplerStats reads the sampler's counters; nil without a data plane.
func (d *Daemon) samplerStats() *control.SamplerStats {
	if d.m == nil {
		return nil
	}
	d.mu.Lock()
	var st control.SamplerStats
	if d.cur.compiled != nil {
		st.OneIn, st.MaxPerSecond = d.cur.compiled.Sampling.OneIn, d.cur.compiled.Sampling.MaxPerSecond
	}
	d.mu.Unlock()
	st.Read, st.Dropped = d.shield.read.Load(), d.shield.dropped.Load()
	c, err := d.m.Samples.Counters()
	if err != nil {
		st.Error = err.Error()
		return &st
	}
	st.Chosen, st.Sent, st.Capped, st.Lost = c.Chosen, c.Sent, c.Capped, c.Lost
	return &st
}

// samplerCollector exports samplerStats.
type samplerCollector struct {
	d            *Daemon
	chosen, read *prometheus.Desc
}

func newSamplerCollector(d *Daemon) *samplerCollector {
	return &samplerCollector{d: d,
		chosen: prometheus.NewDesc("edgeguard_sampler_chosen_packets_total",
			"Packets the 1-in-N sampler chose, by outcome: sent (a sample in the ring buffer), capped (over sampling.max_per_second: its weight goes to the CPU's next sample), lost (the ring buffer was full).",
			[]string{"outcome"}, nil),
		read: prometheus.NewDesc("edgeguard_sampler_samples_read_total",
			"1-in-N samples the daemon read from the ring buffer (sent less read: in the ring buffer now).", nil, nil),
	}
}

func (c *samplerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.chosen
	ch <- c.read
}

func (c *samplerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.d.samplerStats()
	if st == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.read, prometheus.CounterValue, float64(st.Read))
	if st.Error != "" {
		c.d.log.Warn("metrics: sampler counters", "err", st.Error)
		return
	}
	for _, o := range []struct {
		name string
		v    uint64
	}{{"sent", st.Sent}, {"capped", st.Capped}, {"lost", st.Lost}} {
		ch <- prometheus.MustNewConstMetric(c.chosen, prometheus.CounterValue, float64(o.v), o.name)
	}
}
