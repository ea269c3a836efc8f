package maps

import (
	"errors"
	"testing"
)

// TestDecodeSampleBounds: a record shorter than the oldest sample layout
// is ErrBadSample (the reader skips it and reads on); one at that length,
// the full length or longer decodes.
func TestDecodeSampleBounds(t *testing.T) {
	for _, n := range []int{0, 1, 47} {
		if _, err := decodeSample(make([]byte, n)); !errors.Is(err, ErrBadSample) {
			t.Errorf("%d bytes: err %v, want ErrBadSample", n, err)
		}
	}
	for _, n := range []int{48, 64, 4096} {
		b := make([]byte, n)
		b[0] = 7 // ktime_ns's low byte
		s, err := decodeSample(b)
		if err != nil {
			t.Errorf("%d bytes: %v", n, err)
			continue
		}
		if s.Time != 7 {
			t.Errorf("%d bytes: time %v, want 7ns", n, s.Time)
		}
	}
}
