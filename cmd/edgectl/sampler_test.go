package main

import (
	"bytes"
	"testing"

	"github.com/edgeguard/edgeguard/internal/control"
)

// TestWriteSamplerStats: the sampler's line of edgectl stats, on, off and
// with unreadable counters; nothing without a data plane.
func TestWriteSamplerStats(t *testing.T) {
	for _, tc := range []struct {
		st   *control.SamplerStats
		want string
	}{
		{nil, ""},
		{&control.SamplerStats{OneIn: 1024, MaxPerSecond: 20000, Chosen: 10, Sent: 6, Capped: 3, Lost: 1, Read: 5, Dropped: 2},
			"\nsampler: 1 in 1024, at most 20000/s; chosen 10: sent 6, capped 3, lost (ring buffer full) 1; daemon read 5, shield queue full 2\n"},
		{&control.SamplerStats{}, "\nsampler: off (sampling.one_in 0); chosen 0: sent 0, capped 0, lost (ring buffer full) 0; daemon read 0, shield queue full 0\n"},
		{&control.SamplerStats{OneIn: 1, MaxPerSecond: 5, Error: "read sampler counters: boom"},
			"\nsampler: 1 in 1, at most 5/s; counters unreadable: read sampler counters: boom\n"},
	} {
		var b bytes.Buffer
		if err := writeSamplerStats(&b, tc.st); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.st, b.String(), tc.want)
		}
	}
}
