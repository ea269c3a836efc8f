package shed

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive limit defaults, applied to zero AdaptiveConfig fields.
const (
	DefaultAdaptiveInitialLimit = 20
	DefaultAdaptiveMinLimit     = 1
	DefaultAdaptiveMaxLimit     = 1000
	DefaultAdaptiveInterval     = time.Second
	DefaultAdaptiveMinSamples   = 10
	DefaultAdaptiveSampleEvery  = 1
	DefaultAdaptiveTolerance    = 150
	DefaultAdaptiveBackoff      = 90
	DefaultAdaptiveRebaseline   = 5
	// rebaselineImprovePercent: after RebaselineWindows cuts in a row, a
	// mean latency that fell by less than this is not caused by our load.
	rebaselineImprovePercent = 10
)

// AdaptiveConfig configures the AIMD concurrency limit. Every window
// (Interval, or each UpdateLimit call) it compares the mean service latency
// of the window with a baseline latency:
//
//   - mean > baseline*TolerancePercent/100: the backend is congested;
//     limit = limit*BackoffPercent/100 (at least one less, never below MinLimit).
//   - otherwise, if the window used at least half the limit: limit+1 (never
//     above MaxLimit). An idle limiter does not grow.
//
// The baseline is the lowest window mean seen, with one exception that keeps
// the limit from pinning at MinLimit: if RebaselineWindows congested windows
// in a row cut the limit and the mean latency fell by less than 10% over
// them, the latency is not caused by this limiter's load (a slower
// dependency, a bigger payload), and the current mean becomes the baseline,
// after which the limit grows again. Latency the limiter does cause falls as
// the limit is cut, so it never becomes the baseline: the limit settles where
// latency reaches the tolerance instead of drifting up with it. When latency
// falls back, the baseline follows at once and the limit grows.
type AdaptiveConfig struct {
	InitialLimit int
	MinLimit     int
	MaxLimit     int
	// Interval is Run's update period.
	Interval time.Duration
	// MinSamples: a window with fewer latency samples is not judged; its
	// samples carry over to the next window.
	MinSamples int
	// SampleEvery times one request in this many (per priority) instead of
	// all: each sample costs two clock reads, 30 to 170 ns each on a busy
	// VM. MinSamples counts timed requests.
	SampleEvery       int
	TolerancePercent  int
	BackoffPercent    int
	RebaselineWindows int
}

// aimd holds the adaptive limit's state. observe and noteInFlight run on
// the request path (atomics only); update runs off it.
type aimd struct {
	sumNs       atomic.Int64
	count       atomic.Int64
	maxInFlight atomic.Int64

	minLimit, maxLimit int64
	interval           time.Duration
	minSamples         int64
	sampleEvery        uint64
	tolerance          int64
	backoff            int64
	rebaseline         int64

	mu       sync.Mutex
	limit    int64
	baseline int64 // ns; 0 until the first judged window
	// congested counts the congested windows in a row, up to rebaseline;
	// runStart is the mean of the first of them.
	congested int64
	runStart  int64
	pendSum   int64
	pendCount int64
	pendMax   int64
}

func newAIMD(c AdaptiveConfig) (*aimd, error) {
	orDefault := func(v, d int) int64 {
		if v == 0 {
			return int64(d)
		}
		return int64(v)
	}
	a := &aimd{
		limit:       orDefault(c.InitialLimit, DefaultAdaptiveInitialLimit),
		minLimit:    orDefault(c.MinLimit, DefaultAdaptiveMinLimit),
		maxLimit:    orDefault(c.MaxLimit, DefaultAdaptiveMaxLimit),
		interval:    c.Interval,
		minSamples:  orDefault(c.MinSamples, DefaultAdaptiveMinSamples),
		sampleEvery: uint64(orDefault(c.SampleEvery, DefaultAdaptiveSampleEvery)),
		tolerance:   orDefault(c.TolerancePercent, DefaultAdaptiveTolerance),
		backoff:     orDefault(c.BackoffPercent, DefaultAdaptiveBackoff),
		rebaseline:  orDefault(c.RebaselineWindows, DefaultAdaptiveRebaseline),
	}
	if a.interval == 0 {
		a.interval = DefaultAdaptiveInterval
	}
	switch {
	case a.minLimit < 1 || a.maxLimit < a.minLimit:
		return nil, fmt.Errorf("limits min %d max %d: need 1 <= min <= max", a.minLimit, a.maxLimit)
	case a.limit < a.minLimit || a.limit > a.maxLimit:
		return nil, fmt.Errorf("initial limit %d outside [%d, %d]", a.limit, a.minLimit, a.maxLimit)
	case a.interval < 0 || a.minSamples < 1:
		return nil, fmt.Errorf("interval %s and min samples %d must be positive", a.interval, a.minSamples)
	case c.SampleEvery < 0:
		return nil, fmt.Errorf("sample every %d requests: must be positive", c.SampleEvery)
	case a.tolerance <= 100:
		return nil, fmt.Errorf("tolerance %d%%: must exceed 100", a.tolerance)
	case a.backoff < 1 || a.backoff >= 100:
		return nil, fmt.Errorf("backoff %d%%: must be in [1, 99]", a.backoff)
	case a.rebaseline < 1:
		return nil, fmt.Errorf("rebaseline after %d windows: must be at least 1", a.rebaseline)
	}
	return a, nil
}

// observe records one service latency sample.
func (a *aimd) observe(ns int64) {
	a.sumNs.Add(max(ns, 0))
	a.count.Add(1)
}

// noteInFlight records the in-flight count reached by an admission.
func (a *aimd) noteInFlight(n int64) {
	for {
		m := a.maxInFlight.Load()
		if n <= m || a.maxInFlight.CompareAndSwap(m, n) {
			return
		}
	}
}

// update closes a window and returns the new limit. inFlight is the count
// right now (slots held across the whole window count as used).
func (a *aimd) update(inFlight int64) (limit int64, judged bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// The three swaps are not one atomic step: a sample landing between them
	// may count in this window's count and the next window's sum. At
	// MinSamples and above that skews one mean by at most one sample.
	a.pendCount += a.count.Swap(0)
	a.pendSum += a.sumNs.Swap(0)
	a.pendMax = max(a.pendMax, a.maxInFlight.Swap(0), inFlight)
	if a.pendCount < a.minSamples {
		return a.limit, false
	}
	mean := a.pendSum / a.pendCount
	used := a.pendMax
	a.pendSum, a.pendCount, a.pendMax = 0, 0, 0

	if a.baseline == 0 || mean < a.baseline {
		a.baseline = mean
	}
	if mean*100 <= a.baseline*a.tolerance {
		a.congested = 0
		if used*2 >= a.limit {
			a.limit = min(a.limit+1, a.maxLimit)
		}
		return a.limit, true
	}
	if a.congested == 0 {
		a.runStart = mean
	}
	a.congested++
	a.limit = max(min(a.limit*a.backoff/100, a.limit-1), a.minLimit)
	if a.congested == a.rebaseline {
		if mean*100 > a.runStart*(100-rebaselineImprovePercent) {
			// Cutting did not help: this latency is the new normal.
			a.baseline = mean
		}
		a.congested = 0
	}
	return a.limit, true
}

// UpdateLimit closes the adaptive limit's current window and applies the
// result; Run calls it every Interval. It is a no-op for a static limit and
// returns the limit in force.
func (l *Limiter) UpdateLimit() int64 {
	if l.adaptive == nil {
		return l.limit.Load()
	}
	next, judged := l.adaptive.update(l.InFlight())
	if old := l.limit.Load(); judged && next != old {
		l.log.Debug("adaptive concurrency limit changed", "from", old, "to", next)
		l.setLimit(next)
	}
	return next
}

// Run updates the adaptive limit every Interval until ctx ends. It returns
// at once for a static limit.
func (l *Limiter) Run(ctx context.Context) {
	if l.adaptive == nil {
		return
	}
	runEvery(ctx, l.adaptive.interval, func() { l.UpdateLimit() })
}

// runEvery calls f every interval until ctx ends.
func runEvery(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// Baseline returns the adaptive limit's baseline latency (0 before the first
// judged window, or for a static limit).
func (l *Limiter) Baseline() time.Duration {
	if l.adaptive == nil {
		return 0
	}
	l.adaptive.mu.Lock()
	defer l.adaptive.mu.Unlock()
	return time.Duration(l.adaptive.baseline)
}
