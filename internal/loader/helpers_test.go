package loader_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
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

var smallSizes = loader.Sizes{MaxRules: 64, SrcEntries: 4096, AggEntries: 4096, PrefixEntries: 4096, ListEntries: 1024, L4Entries: 64}

func newTestDatapath(tb testing.TB, sizes loader.Sizes) *testDatapath {
	tb.Helper()
	requireRoot(tb)
	d, err := loader.Load(loader.Options{Sizes: sizes, TestClock: true})
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { d.Close() })
	return &testDatapath{tb: tb, d: d, m: maps.New(d)}
}

// openPinnedTestDatapath is newTestDatapath with maps pinned under pinDir:
// a second call re-opens them, as a restarted daemon does. The caller
// unpins pinDir.
func openPinnedTestDatapath(tb testing.TB, sizes loader.Sizes, pinDir string) *testDatapath {
	tb.Helper()
	d, err := loader.Load(loader.Options{Sizes: sizes, TestClock: true, PinDir: pinDir})
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { d.Close() })
	return &testDatapath{tb: tb, d: d, m: maps.New(d)}
}

func (td *testDatapath) apply(g policy.Compiled) {
	td.tb.Helper()
	if err := stageCommit(td.m, &g); err != nil {
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

// stageCommit makes c the live generation: Stage, then Commit.
func stageCommit(m *maps.Maps, c *policy.Compiled) error {
	s, err := m.Generations.Stage(c)
	if err != nil {
		return err
	}
	return m.Generations.Commit(s)
}
