package control

import (
	"net/netip"
	"time"
)

// SYNStats is the SYN path's part of `edgectl stats` (docs/tcp.md).
type SYNStats struct {
	// Available is false when this kernel lacks what the SYN path needs;
	// Unavailable then says what.
	Available   bool             `json:"available"`
	Unavailable string           `json:"unavailable,omitempty"`
	Error       string           `json:"error,omitempty"`
	Services    []SYNServiceStat `json:"services,omitempty"`
}

// SYNServiceStat is one protected service's counters since load.
type SYNServiceStat struct {
	Service string `json:"service"`
	Active  bool   `json:"active"` // SYNs answered by the data plane now
	// MPTCPListener: the service's listener is MPTCP, so its SYNs go to
	// the kernel (the data plane's cookies would reset each new client's
	// first connection); protection is off for it until it is plain TCP.
	MPTCPListener     bool   `json:"mptcp_listener,omitempty"`
	SYNs              uint64 `json:"syns"`
	Answered          uint64 `json:"answered"`
	WouldAnswer       uint64 `json:"would_answer"`
	AnswerLimited     uint64 `json:"answer_limited"`
	BadSYNs           uint64 `json:"bad_syns"`
	ValidatedPassed   uint64 `json:"validated_passed"`
	CookiesValid      uint64 `json:"cookies_valid"`
	CookiesInvalid    uint64 `json:"cookies_invalid"`
	OutOfStateDropped uint64 `json:"out_of_state_dropped"`
	OutOfStatePassed  uint64 `json:"out_of_state_passed"`
	Established       uint64 `json:"established"`
	Requests          uint64 `json:"requests"`
	RequestFailures   uint64 `json:"request_failures"`
	Denied            uint64 `json:"denied"`
	Activations       uint64 `json:"activations"`
}

// ExplainSYN is the SYN path's part of `edgectl explain ADDR`: what it
// would do with a bare SYN from the address to each protected service
// (docs/tcp.md).
type ExplainSYN struct {
	// Available is false when the SYN path is not loaded although the
	// policy protects services; Unavailable then says why.
	Available   bool   `json:"available"`
	Unavailable string `json:"unavailable,omitempty"`
	// Bypass: the source has validated standing, so its SYNs skip the
	// SYN path (to the limiter and the kernel) until BypassUntil.
	Bypass      bool                `json:"bypass"`
	BypassUntil *time.Time          `json:"bypass_until,omitempty"`
	Services    []ExplainSYNService `json:"services,omitempty"`
}

// ExplainSYNService is one protected service, as seen from the address.
type ExplainSYNService struct {
	Service    string `json:"service"`
	Protection string `json:"protection"` // off, monitor, auto, always
	Active     bool   `json:"active"`     // SYNs answered by the data plane now
	// Probe: the probe packet (--proto tcp --dport) is to this service.
	Probe bool `json:"probe,omitempty"`
	// Next is what a bare SYN from the address to the service gets now,
	// as the SYN path's model decides it; Steps are the model's steps.
	Next  string   `json:"next"`
	Steps []string `json:"steps,omitempty"`
	// ProbeSegment is what the probe's own segment gets (when it is for
	// this service and its --flags are not a bare SYN), asked as one of no
	// connection: explain does not see the host's sockets.
	ProbeSegment string `json:"probe_segment,omitempty"`
	// AnswerPrefix is the source's answer prefix; AnswersAvailable of
	// AnswersBurst SYN-ACKs are left in its budget (both 0: no budget).
	AnswerPrefix     netip.Prefix `json:"answer_prefix"`
	AnswersAvailable float64      `json:"answers_available"`
	AnswersBurst     float64      `json:"answers_burst"`
	// Counters are the service's counters since the SYN path was loaded
	// (all sources).
	Counters SYNServiceStat `json:"counters"`
}
