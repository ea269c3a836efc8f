package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// sampleRings is the samples subsystem: the reader of each ring buffer
// the data plane fills (drop samples; the 1-in-N sampler's samples) and
// the sampler's counters (docs/metrics.md, "Sampler"). It hands each
// sample to those who use it (given at its making) and every sample to
// the captures. It follows the committed generation for the sampler's
// settings it reports; it writes no map.
type sampleRings struct {
	log *slog.Logger
	// store is the data plane's rings and sampler counters; nil before it
	// loads.
	store *maps.SampleStore
	// drop takes each drop sample (top talkers, recent samples, the
	// congestion watch), rate each 1-in-N sample (the shield); capture
	// every sample with its frame.
	drop    func(now time.Time, s maps.Sample)
	rate    func(s maps.Sample)
	capture *captureHub
	// rateDropped counts 1-in-N samples rate could not take (the shield's
	// queue was full).
	rateDropped func() uint64

	read atomic.Uint64 // 1-in-N samples read from the ring buffer

	mu       sync.Mutex // guards sampling; a leaf
	sampling *policy.Sampling
}

// follow takes the committed generation's sampler settings. It cannot
// fail.
func (r *sampleRings) follow(_ context.Context, c committed) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sampling = &c.run.compiled.Sampling
	return nil
}

// readDrops feeds drop samples from their ring buffer to drop.
func (r *sampleRings) readDrops(ctx context.Context) error {
	rd, err := r.store.NewDropReader()
	if err != nil {
		return err
	}
	return r.readRing(ctx, "drop samples", rd, func(s maps.Sample) {
		r.drop(time.Now(), s)
	})
}

// readRates feeds the data plane's 1-in-N samples (their own ring
// buffer, one reader) to rate. Without the ring buffer the shield learns
// from the aggregate counters alone.
func (r *sampleRings) readRates(ctx context.Context) error {
	rd, err := r.store.NewRateReader()
	if err != nil {
		r.log.Warn("shield: no 1-in-N samples; it learns from the aggregate counters alone", "err", err)
		return nil
	}
	return r.readRing(ctx, "1-in-N samples", rd, func(s maps.Sample) {
		r.read.Add(1)
		r.rate(s)
	})
}

// readRing hands each sample of rd to each until ctx ends (which closes
// rd) or the ring fails. A record that is not a sample is skipped and
// logged (the first, then every 1,000th): one bad record must not stop
// the reader.
func (r *sampleRings) readRing(ctx context.Context, ring string, rd *maps.SampleReader, each func(maps.Sample)) error {
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	var bad uint64
	for {
		s, err := rd.Read()
		if errors.Is(err, maps.ErrBadSample) {
			if bad%1000 == 0 {
				r.log.Warn("skipped a ring buffer record that is not a sample", "ring", ring, "skipped", bad+1, "err", err)
			}
			bad++
			continue
		}
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		each(s)
		r.capture.publish(s, rd.Frame())
	}
}

// stats reads the sampler's counters; nil without a data plane.
func (r *sampleRings) stats() *control.SamplerStats {
	if r.store == nil {
		return nil
	}
	var st control.SamplerStats
	r.mu.Lock()
	if r.sampling != nil {
		st.OneIn, st.MaxPerSecond = r.sampling.OneIn, r.sampling.MaxPerSecond
	}
	r.mu.Unlock()
	st.Read, st.Dropped = r.read.Load(), r.rateDropped()
	c, err := r.store.Counters()
	if err != nil {
		st.Error = err.Error()
		return &st
	}
	st.Chosen, st.Sent, st.Capped, st.Lost = c.Chosen, c.Sent, c.Capped, c.Lost
	return &st
}

// samplerCollector exports sampleRings.stats.
type samplerCollector struct {
	r            *sampleRings
	chosen, read *prometheus.Desc
}

func newSamplerCollector(r *sampleRings) *samplerCollector {
	return &samplerCollector{r: r,
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
	st := c.r.stats()
	if st == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.read, prometheus.CounterValue, float64(st.Read))
	if st.Error != "" {
		c.r.log.Warn("metrics: sampler counters", "err", st.Error)
		return
	}
	for _, o := range []struct {
		name string
		v    uint64
	}{{"sent", st.Sent}, {"capped", st.Capped}, {"lost", st.Lost}} {
		ch <- prometheus.MustNewConstMetric(c.chosen, prometheus.CounterValue, float64(o.v), o.name)
	}
}
