package loader_test

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// TestVerifierBudget loads the limiter as production does and as the tests
// do (test clock) and reports how many instructions the verifier processed,
// against the kernel's limit of 1,000,000: a change that pushes it near the
// limit fails here, with the number, before a kernel refuses it.
func TestVerifierBudget(t *testing.T) {
	requireRoot(t)
	for _, testClock := range []bool{false, true} {
		d, err := loader.Load(loader.Options{Sizes: smallSizes, TestClock: testClock})
		if err != nil {
			t.Fatalf("load (test clock %v): %v", testClock, err)
		}
		info, err := d.Objects.XdpLimiter.Info()
		if err != nil {
			t.Fatal(err)
		}
		n, ok := info.VerifiedInstructions()
		d.Close()
		if !ok {
			t.Skip("kernel does not report verified instructions")
		}
		t.Logf("test clock %v: %d instructions verified (limit 1,000,000)", testClock, n)
		if n > 975_000 {
			t.Errorf("test clock %v: %d instructions verified, within 2.5%% of the limit", testClock, n)
		}
	}
}
