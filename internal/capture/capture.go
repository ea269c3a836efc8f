// Package capture turns the data plane's packet samples into packet
// captures (edgectl capture; docs/operations.md, "Capture"): which samples
// a capture takes, a tcpdump filter compiled by tcpdump itself and run on
// each sample's bytes by a classic BPF interpreter in Go, and pcapng files
// with each frame's verdict in its comment.
package capture

import (
	"fmt"
	"slices"
	"strings"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// Which samples a capture takes.
type Which string

// What to capture.
const (
	// Dropped: dropped and would-drop (dry-run) frames: the drop samples,
	// and the 1-in-N samples of deny-list drops (which the drop sampler
	// never sends), so no packet is in the file twice.
	Dropped Which = "dropped"
	// Passed: passed frames (1-in-N samples only).
	Passed Which = "passed"
	// All: both.
	All Which = "all"
)

// Selection says which samples a capture takes.
type Selection struct {
	Which   Which
	Reasons []maps.Reason // empty: every reason
}

// ParseSelection checks which and the reason names against the data
// plane's reasons (the names of enum eg_reason).
func ParseSelection(which string, reasons []string) (Selection, error) {
	s := Selection{Which: Which(which)}
	switch s.Which {
	case "":
		s.Which = Dropped
	case Dropped, Passed, All:
	default:
		return Selection{}, fmt.Errorf("capture %q: want dropped, passed or all", which)
	}
	for _, name := range reasons {
		r, ok := maps.ReasonByName(name)
		if !ok {
			return Selection{}, fmt.Errorf("unknown reason %q: want one of %s", name, strings.Join(maps.ReasonNames(), ", "))
		}
		s.Reasons = append(s.Reasons, r)
	}
	return s, nil
}

// Wants says whether the capture takes a sample.
func (s Selection) Wants(sm maps.Sample) bool {
	dropped := sm.Action != maps.ActPass
	// A drop the drop sampler may have sent as well: only its sample.
	if sm.Kind == maps.SampleRate && dropped && sm.Reason != maps.ReasonDeny {
		return false
	}
	switch s.Which {
	case Dropped:
		if !dropped {
			return false
		}
	case Passed:
		if dropped {
			return false
		}
	}
	return len(s.Reasons) == 0 || slices.Contains(s.Reasons, sm.Reason)
}
