package control

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
	Service           string `json:"service"`
	Active            bool   `json:"active"` // SYNs answered by the data plane now
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
