package control

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ShieldReport is the answer of GET /v1/shield (edgectl shield): the
// adaptive shield's top aggregates, its actions and forbidden aggregates.
type ShieldReport struct {
	Mode       string            `json:"mode"` // off, monitor, enforce
	Tracked    int               `json:"tracked"`
	Capacity   int               `json:"capacity"`
	Surges     uint64            `json:"surges"`
	WouldDrop  float64           `json:"would_drop_packets"` // estimated, monitor mode
	Aggregates []ShieldAggregate `json:"aggregates"`
	Actions    []ShieldAction    `json:"actions"`
	Forbid     []string          `json:"forbid"`
	Error      string            `json:"error,omitempty"`
}

// ShieldAggregate is one learned aggregate.
type ShieldAggregate struct {
	Aggregate    string   `json:"aggregate"`
	Baseline     float64  `json:"baseline_pps"`
	BaselineBits float64  `json:"baseline_bps"`
	Rate         float64  `json:"rate_pps"`
	Bits         float64  `json:"rate_bps"`
	Factor       float64  `json:"factor"`
	State        string   `json:"state"` // normal, pending, surging, cooling
	Learned      Duration `json:"learned"`
	Judged       bool     `json:"judged"`
	// LearningPaused: still learning and surging against what it learned
	// so far; the surge is not learned, nothing acts on it yet.
	LearningPaused bool   `json:"learning_paused,omitempty"`
	Action         uint32 `json:"action,omitempty"`
}

// ShieldAction is one action of the shield.
type ShieldAction struct {
	ID          uint32    `json:"id"`
	Kind        string    `json:"kind"` // tighten, fingerprint
	Aggregate   string    `json:"aggregate"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	Budget      float64   `json:"budget_pps"`
	Baseline    float64   `json:"baseline_pps"`
	Rate        float64   `json:"rate_pps"`
	Coverage    float64   `json:"coverage,omitempty"`
	Collateral  float64   `json:"collateral,omitempty"`
	Reason      string    `json:"reason"`
	Since       time.Time `json:"since"`
	Expires     time.Time `json:"expires"`
	Pinned      bool      `json:"pinned,omitempty"`
	PinnedBy    string    `json:"pinned_by,omitempty"`
	Enforced    bool      `json:"enforced"`
	// Adopted: found in the data plane at start (an earlier run's), kept
	// until it expires, not renewed.
	Adopted bool `json:"adopted,omitempty"`
}

// ShieldRequest is the body of POST /v1/shield/{release,pin,forbid}.
type ShieldRequest struct {
	ID        uint32 `json:"id,omitempty"`        // release, pin
	Aggregate string `json:"aggregate,omitempty"` // forbid: a prefix, ASNNN or an aggregate
	Remove    bool   `json:"remove,omitempty"`    // forbid: lift it
	By        string `json:"by,omitempty"`        // who asks (recorded in the audit log)
}

// Shield returns the shield's report with the n busiest aggregates.
func (c *Client) Shield(ctx context.Context, n int) (ShieldReport, error) {
	var r ShieldReport
	return r, c.do(ctx, http.MethodGet, "/v1/shield", url.Values{"n": {strconv.Itoa(n)}}, nil, &r)
}

// ShieldDo sends a release, pin or forbid request.
func (c *Client) ShieldDo(ctx context.Context, verb string, req ShieldRequest) (ShieldReport, error) {
	var r ShieldReport
	return r, c.do(ctx, http.MethodPost, "/v1/shield/"+verb, nil, req, &r)
}

// SamplerStats is the 1-in-N sampler's part of `edgectl stats`: the data
// plane's counters since load, summed over CPUs (Chosen = Sent + Capped +
// Lost), and the daemon's side of the ring buffer.
type SamplerStats struct {
	OneIn        uint32 `json:"one_in"`         // sampling.one_in (0: off)
	MaxPerSecond uint64 `json:"max_per_second"` // sampling.max_per_second
	Chosen       uint64 `json:"chosen"`         // packets chosen 1 in one_in
	Sent         uint64 `json:"sent"`           // samples written to the ring buffer
	Capped       uint64 `json:"capped"`         // chosen, not sent: over max_per_second
	Lost         uint64 `json:"lost"`           // chosen, not sent: the ring buffer was full
	// Read are the samples the daemon read from the ring buffer; Dropped
	// those of them the shield did not see (its queue was full).
	Read    uint64 `json:"read"`
	Dropped uint64 `json:"dropped"`
	Error   string `json:"error,omitempty"` // the data plane's counters could not be read
}
