package loader_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

func requireRoot(tb testing.TB) { testenv.RequireRoot(tb) }

// testDatapath is a limiter loaded with the test clock, not pinned, not
// attached: packets go through BPF_PROG_TEST_RUN.
type testDatapath struct {
	tb testing.TB
	d  *loader.Datapath
	m  *maps.Maps
}

var smallSizes = mapstest.SmallSizes

func newTestDatapath(tb testing.TB, sizes loader.Sizes) *testDatapath {
	tb.Helper()
	d, m := mapstest.Load(tb, loader.Options{Sizes: sizes, TestClock: true})
	return &testDatapath{tb: tb, d: d, m: m}
}

// openPinnedTestDatapath is newTestDatapath with maps pinned under pinDir:
// a second call re-opens them, as a restarted daemon does. The caller
// unpins pinDir.
func openPinnedTestDatapath(tb testing.TB, sizes loader.Sizes, pinDir string) *testDatapath {
	tb.Helper()
	d, m := mapstest.Load(tb, loader.Options{Sizes: sizes, TestClock: true, PinDir: pinDir})
	return &testDatapath{tb: tb, d: d, m: m}
}

// loadSynPath loads the SYN path in front of td with the test clock,
// closed when t ends. The SYN path is its own object, loaded only where
// the kernel has what it needs (Linux >= 6.9); the kernel matrix runs the
// tests on 6.1 too, where they have nothing to test: they skip.
func loadSynPath(t *testing.T, td *testDatapath) *loader.SynPath {
	t.Helper()
	if err := loader.ProbeSyn(); err != nil {
		t.Skipf("SYN path not testable on this kernel: %v", err)
	}
	sp, err := loader.LoadSyn(td.d, loader.SynOptions{TestClock: true})
	if err != nil {
		t.Fatalf("load syn path: %v", err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

// diffSeeds is the seeds a differential test runs: EDGEGUARD_DIFF_SEED
// when it is set (to rerun a failure), else def.
func diffSeeds(t *testing.T, def ...uint64) []uint64 {
	t.Helper()
	s := os.Getenv("EDGEGUARD_DIFF_SEED")
	if s == "" {
		return def
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("EDGEGUARD_DIFF_SEED: %v", err)
	}
	return []uint64{n}
}

func (td *testDatapath) apply(g policy.Compiled) {
	td.tb.Helper()
	if err := mapstest.StageCommit(td.m, &g); err != nil {
		td.tb.Fatalf("apply: %v", err)
	}
}

func (td *testDatapath) setClock(d time.Duration) {
	td.tb.Helper()
	if err := td.m.SetTestClock(uint64(d)); err != nil {
		td.tb.Fatalf("set clock: %v", err)
	}
}

// run sends one frame through the program and returns its XDP action.
func (td *testDatapath) run(frame []byte) uint32 {
	td.tb.Helper()
	ret, err := td.d.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		td.tb.Fatalf("prog test run: %v", err)
	}
	return ret
}

func (td *testDatapath) counters() maps.Counters {
	td.tb.Helper()
	c, err := td.m.Counters.Totals()
	if err != nil {
		td.tb.Fatal(err)
	}
	return c
}

const (
	xdpDrop = 1
	xdpPass = 2
)

func perSecond(n uint64, burst uint64) policy.Limit {
	return policy.Limit{Rate: policy.Rate{Count: n, Per: time.Second}, Burst: burst}
}

// defaultGen is a policy with only the default rule (id 0).
func defaultGen(r policy.CompiledRule) policy.Compiled {
	return policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Rules:     []policy.CompiledRule{r},
	}
}
