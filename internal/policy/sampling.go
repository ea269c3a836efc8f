package policy

import (
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Sampling is the sampling: section: the data plane's 1-in-N random samples
// of passed and dropped packets, from which the adaptive shield and fleet
// mode estimate rates (docs/operations.md, "Sampling"). OneIn 0 turns it
// off.
type Sampling struct {
	// OneIn is N: each packet is chosen with probability 1/N.
	OneIn uint32
	// MaxPerSecond caps the samples sent to the daemon per second, all
	// CPUs together; chosen packets over the cap are not sent but weigh
	// on the next sample of their CPU, so estimates stay unbiased.
	MaxPerSecond uint64
}

// Sampling defaults and bounds.
const (
	DefaultSamplingOneIn     = 1024
	DefaultSamplingPerSecond = 20_000
	maxSamplingOneIn         = 1 << 24
	maxSamplingPerSecond     = 1_000_000
)

// DefaultSampling is the sampling a file without a sampling: section gets.
func DefaultSampling() Sampling {
	return Sampling{OneIn: DefaultSamplingOneIn, MaxPerSecond: DefaultSamplingPerSecond}
}

// samplingTable is the sampling: section.
var samplingTable = yamlcheck.NewTable("sampling",
	yamlcheck.Val("one_in", yamlcheck.Off[uint32]{Kind: yamlcheck.Uint[uint32]{Min: 1, Max: maxSamplingOneIn}},
		func(s *Sampling) *uint32 { return &s.OneIn }, "each packet is sampled with probability 1/one_in; off: no samples"),
	yamlcheck.Val("max_per_second", yamlcheck.Uint[uint64]{Min: 1, Max: maxSamplingPerSecond},
		func(s *Sampling) *uint64 { return &s.MaxPerSecond }, "the most samples sent to the daemon per second, all CPUs together"),
)
