package loader_test

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/loader"
)

func TestSynLoads(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	sp, err := loader.LoadSyn(td.d, loader.SynOptions{TestClock: true})
	if err != nil {
		t.Fatalf("load syn: %v", err)
	}
	defer sp.Close()
}
