package shield

import (
	"hash/maphash"
	"math"
	"time"
)

// The baseline of an aggregate is a high percentile of its per-interval
// rate, over a histogram whose weights decay with a half-life: old
// intervals fade, a day of history counts as much as the half-life says.
// The histogram has logarithmic buckets, 4 per doubling from 1/s to
// 2^32/s (rates below 1/s fall in the first). A percentile reads as the
// upper edge of its bucket, so a baseline is never below the true decayed
// percentile and at most 19% (2^(1/4)) above it: the shield errs towards
// leaving traffic alone.
const (
	histPerDoubling = 4
	histBuckets     = 32*histPerDoubling + 1
)

var histRatio = math.Pow(2, 1.0/histPerDoubling)

// hist is a decayed histogram of rates.
type hist struct {
	W [histBuckets]float32 `json:"w"`
}

func histBucket(rate float64) int {
	if rate <= 1 {
		return 0
	}
	b := int(math.Ceil(math.Log2(rate) * histPerDoubling))
	return min(max(b, 0), histBuckets-1)
}

// histUpper is bucket b's upper edge.
func histUpper(b int) float64 { return math.Pow(histRatio, float64(b)) }

func (h *hist) add(rate float64, decay float32) {
	for i := range h.W {
		h.W[i] *= decay
	}
	h.W[histBucket(rate)]++
}

// quantile is the q-quantile's bucket's upper edge; 0 with no weight.
func (h *hist) quantile(q float64) float64 {
	var total float64
	for _, w := range h.W {
		total += float64(w)
	}
	if total == 0 {
		return 0
	}
	need, run := q*total, 0.0
	for i, w := range h.W {
		run += float64(w)
		if run >= need {
			if i == 0 {
				return 1
			}
			return histUpper(i)
		}
	}
	return histUpper(histBuckets - 1)
}

// aggState is what the shield keeps per tracked aggregate.
type aggState struct {
	Packets hist          `json:"packets"` // per-interval packet rates
	Bits    hist          `json:"bits"`    // per-interval bit rates
	Learned time.Duration `json:"learned"` // intervals learned (not decayed)
	Seen    time.Time     `json:"seen"`    // last interval with traffic

	// Not saved: the current rate and the surge state restart with the
	// daemon.
	curPkts, curBits float64 // short EWMA, per second
	accPkts, accBits float64 // this interval's weight
	accN, curN       float64 // samples this interval; their EWMA, per second
	det              detector
	own, explained   float64 // surge attribution since the surge began
	shape            RuleShape
	imp              float64 // importance at the last interval (eviction order)
	// pausedFor is how long learning has been paused by a surge while
	// learning (surgeWhileLearning); 0 while it learns.
	pausedFor time.Duration
}

// baseline is the learned packet rate (per second) at the percentile.
func (a *aggState) baseline(q float64) float64 { return a.Packets.quantile(q) }

// cms is a Count-Min sketch of decayed packet weights of aggregates not
// tracked (yet), so a newly heavy aggregate is noticed without a table
// entry for every aggregate ever seen. Estimates are upper bounds.
type cms struct {
	seed  maphash.Seed
	width int
	rows  [cmsDepth][]float32
}

const cmsDepth = 4

func newCMS(width int) *cms {
	c := &cms{seed: maphash.MakeSeed(), width: width}
	for i := range c.rows {
		c.rows[i] = make([]float32, width)
	}
	return c
}

func (c *cms) idx(k Key, row int) int {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteByte(byte(row))
	h.WriteByte(byte(k.Kind))
	b := k.Prefix.Addr().As16()
	h.Write(b[:])
	h.WriteByte(byte(k.Prefix.Bits()))
	var w [15]byte
	w[0], w[1], w[2], w[3] = byte(k.Rule), byte(k.Rule>>8), byte(k.Rule>>16), byte(k.Rule>>24)
	w[4], w[5], w[6], w[7] = byte(k.ASN), byte(k.ASN>>8), byte(k.ASN>>16), byte(k.ASN>>24)
	w[8], w[9], w[10], w[11], w[12] = k.Country[0], k.Country[1], k.Proto, byte(k.Port), byte(k.Port>>8)
	h.Write(w[:])
	return int(h.Sum64() % uint64(c.width))
}

// add adds w to k and returns k's new estimate.
func (c *cms) add(k Key, w float64) float64 {
	est := math.Inf(1)
	for r := range c.rows {
		i := c.idx(k, r)
		c.rows[r][i] += float32(w)
		est = math.Min(est, float64(c.rows[r][i]))
	}
	return est
}

func (c *cms) decay(f float32) {
	for r := range c.rows {
		for i := range c.rows[r] {
			c.rows[r][i] *= f
		}
	}
}
