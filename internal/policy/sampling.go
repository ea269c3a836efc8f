package policy

import (
	"strconv"

	"go.yaml.in/yaml/v3"
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

// formatSampling is the diff's form: "one_in 1024 max_per_second 20000",
// or "off".
func formatSampling(s Sampling) string {
	if s.OneIn == 0 {
		return "off"
	}
	return "one_in " + strconv.FormatUint(uint64(s.OneIn), 10) + " max_per_second " + strconv.FormatUint(s.MaxPerSecond, 10)
}

// sampling parses the sampling: section: one_in (1 to 2^24, or 0 for
// off) and max_per_second (1 to 1,000,000).
func (ps *parser) sampling(n *yaml.Node, base Sampling) Sampling {
	out := base
	f := ps.Fields(n, "sampling", "one_in", "max_per_second")
	if v, ok := f["one_in"]; ok {
		if s, ok := ps.Scalar(v, "sampling.one_in"); ok {
			x, err := strconv.ParseUint(s, 10, 32)
			if err != nil || x > maxSamplingOneIn {
				ps.Errorf(v, "sampling.one_in %q: want a whole number from 1 to %d (0 turns sampling off)", s, maxSamplingOneIn)
			} else {
				out.OneIn = uint32(x)
			}
		}
	}
	if v, ok := f["max_per_second"]; ok {
		if s, ok := ps.Scalar(v, "sampling.max_per_second"); ok {
			x, err := strconv.ParseUint(s, 10, 64)
			if err != nil || x < 1 || x > maxSamplingPerSecond {
				ps.Errorf(v, "sampling.max_per_second %q: want a whole number from 1 to %d", s, maxSamplingPerSecond)
			} else {
				out.MaxPerSecond = x
			}
		}
	}
	return out
}
