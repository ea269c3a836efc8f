package redislimit

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// metrics are the backend's Prometheus series. No label carries a client
// key: labels are an operation, an error kind, a rule name or a policy.
type metrics struct {
	latency      *prometheus.HistogramVec
	errors       *prometheus.CounterVec
	breakerState prometheus.Gauge
	transitions  *prometheus.CounterVec
	fallback     *prometheus.CounterVec
	batchSize    prometheus.Histogram
	hybridLocal  *prometheus.CounterVec
	// hybridForeign counts what a single host (hosts: 1) found in its
	// keys' windows that it did not report, admitted while it held them.
	hybridForeign *prometheus.CounterVec
	// hybridEvictions counts leases evicted for a new key at capacity.
	hybridEvictions *prometheus.CounterVec
	refunds         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgeguard_l7_redis_roundtrip_seconds",
			Help:    "Time of one round trip to Redis (a pipelined batch counts once), by operation.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3},
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_errors_total",
			Help: "Failed Redis operations by operation and kind (connection, timeout, server, breaker_open).",
		}, []string{"op", "kind"}),
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_l7_redis_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_breaker_transitions_total",
			Help: "Circuit breaker state changes by new state.",
		}, []string{"to"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_fallback_decisions_total",
			Help: "Rule decisions made without Redis, by rule, failure policy and verdict.",
		}, []string{"rule", "policy", "verdict"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeguard_l7_redis_batch_size",
			Help:    "Decisions sent in one pipelined round trip.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		hybridLocal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_hybrid_local_decisions_total",
			Help: "Hybrid-mode decisions made from a local lease, by rule and verdict.",
		}, []string{"rule", "verdict"}),
		hybridForeign: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_hybrid_foreign_counts_total",
			Help: "Counts a hybrid rule with hosts: 1 found in its keys' Redis windows that this host did not report and that were admitted while it held the key: another host writes them, by rule.",
		}, []string{"rule"}),
		hybridEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_hybrid_evictions_total",
			Help: "Hybrid leases evicted to make room for a new key when the rule held its capacity of leases (their unsynced counts reported to Redis first), by rule.",
		}, []string{"rule"}),
		refunds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_l7_redis_refunds_total",
			Help: "Charges given back in Redis because another limit refused the request.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.latency, m.errors, m.breakerState, m.transitions, m.fallback, m.batchSize, m.hybridLocal, m.hybridForeign, m.hybridEvictions, m.refunds} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("register redis limiter metrics (one Limiter per registry): %w", err)
			}
			return nil, fmt.Errorf("register redis limiter metrics: %w", err)
		}
	}
	return m, nil
}

// logThrottle lets one line per interval through for each message and
// counts the ones it held back, so a Redis outage under load writes a few
// lines, not one per request.
type logThrottle struct {
	log      *slog.Logger
	clock    l7.Clock
	interval int64

	mu   sync.Mutex
	last map[string]int64
	held map[string]int64
}

func newLogThrottle(log *slog.Logger, clock l7.Clock, interval int64) *logThrottle {
	return &logThrottle{log: log, clock: clock, interval: interval, last: map[string]int64{}, held: map[string]int64{}}
}

func (t *logThrottle) warn(msg string, args ...any) { t.warnFor(msg, msg, args...) }

// warnFor is warn throttled by key instead of the message: one line per
// key (a rule's name in it) and interval.
func (t *logThrottle) warnFor(key, msg string, args ...any) {
	now := t.clock.Now()
	t.mu.Lock()
	last, seen := t.last[key]
	if seen && now-last < t.interval {
		t.held[key]++
		t.mu.Unlock()
		return
	}
	suppressed := t.held[key]
	t.last[key] = now
	t.held[key] = 0
	t.mu.Unlock()
	t.log.Warn(msg, append(args, slog.Int64("suppressed", suppressed))...)
}
