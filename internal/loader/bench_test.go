package loader_test

import (
	"math"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// BenchmarkDataPlane measures the XDP program's cost per packet with
// BPF_PROG_TEST_RUN: the kernel runs the program Repeat times on one frame
// and returns the mean time per run, which excludes the syscall. The metric
// to quote is ns/pkt; ns/op is wall time per packet including syscalls and
// time the benchmark waited for a CPU, and is not.
//
// Every datapath here runs on the kernel clock (no test clock), as in
// production. Rates that must never run out are 10^9/s; rates that must
// stay exhausted are 1 per hour.
//
// The kernel repeats one frame. Cases with many sources run chunks of
// Repeat runs per frame where the source does not change the work
// (drop_prefix) or where the steady state is what is compared
// (pass_1M_keys). Where every packet must be a new source (random_src, and
// rules_100k's new-src metrics) a source feeder program rewrites the
// source before each run and tail-calls the program, so Repeat still
// applies. The single-run metrics of pass_1M_keys include the test
// runner's fixed cost (two clock reads), reported as timer-ns/run.
//
//	sudo go test -run '^$' -bench BenchmarkDataPlane ./internal/loader
func BenchmarkDataPlane(b *testing.B) {
	if os.Geteuid() != 0 {
		// Benchmarks are not CI gates: skip, even in CI.
		b.Skip("needs root (CAP_BPF, CAP_NET_ADMIN) to load and run BPF programs")
	}

	b.Run("floor", func(b *testing.B) {
		cached(b, "floor", func(b *testing.B) *benchCase {
			return &benchCase{prog: bareDrop(b), frames: [][]byte{benchFrame(src4(1))}, want: xdpDrop}
		}).measure(b)
	})
	b.Run("pass", func(b *testing.B) {
		cached(b, "pass", passCase).measure(b)
	})
	b.Run("pass_sampled", func(b *testing.B) {
		// "pass" with the default 1-in-N sampling (bench_override_test.go).
		cached(b, "pass_sampled", passSampledCase).measure(b)
	})
	b.Run("pass_asn", func(b *testing.B) {
		// "pass" with an ASN aggregate (bench_override_test.go): the
		// baseline of the override cases. x-pass is its cost over pass.
		cached(b, "pass_asn", passASNCase).measure(b)
	})
	b.Run("override", func(b *testing.B) {
		// pass_asn with an override of the packets' ASN aggregate: a
		// replacement budget, two hash lookups. x-pass_asn is the cost of
		// the override, x-pass against the plain pass case.
		cached(b, "override", overrideCase(false)).measure(b)
	})
	b.Run("override_new", func(b *testing.B) {
		// override with a new-source bucket too: the source's standing is
		// looked up and a second bucket charged.
		cached(b, "override_new", overrideCase(true)).measure(b)
	})
	b.Run("watch", func(b *testing.B) {
		// pass_asn with the rule's ASN aggregates watched (counted per
		// instance).
		cached(b, "watch", watchCase).measure(b)
	})
	// Fingerprint rules (bench_override_test.go): "pass" with 1, 100 and
	// 1,000 fingerprints over up to 3 masks, and 8 fingerprints over the
	// most masks the data plane allows (8), none matching the frame nor
	// naming its port; _sameport: 1,000 on the frame's port; _collide:
	// 1,000 that the prefilter cannot tell from a match (every slot's
	// hash lookup). x-pass is the ratio to "pass", timed in alternating
	// chunks.
	b.Run("fingerprint_1", func(b *testing.B) { cached(b, "fingerprint_1", fingerprintCase(1, 1, fpOtherPort)).measure(b) })
	b.Run("fingerprint_100", func(b *testing.B) { cached(b, "fingerprint_100", fingerprintCase(100, 3, fpOtherPort)).measure(b) })
	b.Run("fingerprint_1000", func(b *testing.B) { cached(b, "fingerprint_1000", fingerprintCase(1000, 3, fpOtherPort)).measure(b) })
	b.Run("fingerprint_masks8", func(b *testing.B) { cached(b, "fingerprint_masks8", fingerprintCase(8, 8, fpOtherPort)).measure(b) })
	b.Run("fingerprint_1000_sameport", func(b *testing.B) {
		cached(b, "fingerprint_1000_sameport", fingerprintCase(1000, 3, fpSamePort)).measure(b)
	})
	b.Run("fingerprint_1000_collide", func(b *testing.B) {
		cached(b, "fingerprint_1000_collide", fingerprintCase(1000, 3, fpCollide)).measure(b)
	})
	b.Run("drop_per_ip", func(b *testing.B) {
		cached(b, "drop_per_ip", func(b *testing.B) *benchCase {
			bd := loadBench(b, smallSizes)
			r := policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: onePerHour}}
			bd.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{r}})
			return &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpDrop}
		}).measure(b)
	})
	b.Run("drop_prefix", func(b *testing.B) {
		// The /16 aggregate is over budget, so every packet is dropped by
		// the look-ahead before any per-source state is touched: the
		// source does not change the work, and chunks of 256 runs per
		// frame over the 65,536 sources of 198.18.0.0/16 measure the same
		// path as one run each would, without the runner's fixed cost.
		cached(b, "drop_prefix", func(b *testing.B) *benchCase {
			return aggregateDropCase(b, policy.AggregateDerived)
		}).measure(b)
	})
	b.Run("drop_whole", func(b *testing.B) {
		// As drop_prefix, with the default rule's per_prefix group:
		// whole, one bucket for every source (a whole-space spoofed
		// flood): the look-ahead reads the rule's slot of whole_buckets.
		cached(b, "drop_whole", func(b *testing.B) *benchCase {
			return aggregateDropCase(b, policy.AggregateWhole)
		}).measure(b)
	})
	b.Run("deny", func(b *testing.B) {
		cached(b, "deny", func(b *testing.B) *benchCase {
			bd := loadBench(b, smallSizes)
			bd.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{generousRule(0)}})
			deny := []maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.0.0/24"), DenyUntil: maps.Forever, Origin: maps.OriginCLI}}
			if err := bd.m.Lists.Set(deny); err != nil {
				b.Fatal(err)
			}
			return &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpDrop}
		}).measure(b)
	})
	b.Run("congested_new_refused", func(b *testing.B) {
		// A whole aggregate held inside its reserve band (see
		// congestedCase): a new source's packet meets the band, looks its
		// standing up (no entry, not known good) and is refused by the
		// reserve without a charge.
		cached(b, "congested_new_refused", func(b *testing.B) *benchCase {
			return congestedCase(b, false)
		}).measure(b)
	})
	b.Run("congested_established", func(b *testing.B) {
		// The same aggregate, an established source: its standing is
		// looked up and it is admitted inside the band (personal budgets
		// off: the path before them).
		cached(b, "congested_established", func(b *testing.B) *benchCase {
			return congestedCase(b, true)
		}).measure(b)
	})
	b.Run("congested_within_budget", func(b *testing.B) {
		// The same, with personal budgets on: the established source is
		// within its budget (the default, 10^9/s), charged to it and
		// admitted inside the band.
		cached(b, "congested_within_budget", func(b *testing.B) *benchCase {
			return congestedBudgetCase(b, false)
		}).measure(b)
	})
	b.Run("congested_over_budget", func(b *testing.B) {
		// The same, the established source over its budget (its GCRA
		// word an hour ahead): charged as new, refused by the reserve.
		cached(b, "congested_over_budget", func(b *testing.B) *benchCase {
			return congestedBudgetCase(b, true)
		}).measure(b)
	})
	b.Run("pass_1M_keys", func(b *testing.B) {
		// 1,000,000 per-source buckets in a 2^20 table. Frames cycle
		// through 65,536 of the filled sources spread over the whole
		// table, in chunks of 256 runs per frame: ns/pkt is the steady
		// state, comparable with "pass". cold-ns/run is one run per
		// source (each marked in the new-source filter beforehand, so the
		// run looks its bucket up), so every bucket lookup misses the
		// caches and the TLB;
		// hit-1run-ns is one run per syscall on a single source: the same
		// runner and cold-code cost, without the table misses.
		cached(b, "pass_1M_keys", pass1MKeys).measure(b)
	})
	b.Run("rules_100k", func(b *testing.B) {
		// The target is relative to "pass", and this machine's speed
		// drifts, so x-pass compares the two in interleaved chunks.
		cached(b, "rules_100k", rules100k).measure(b)
	})
	b.Run("random_src", func(b *testing.B) {
		// A new source on every packet, as in a spoofed flood's steady
		// state: the 2^20 per-source table is filled first (under another
		// rule id, so no key collides), then every packet is a source
		// it does not hold. The source feeder (feeder_bench_test.go)
		// gives each of the Repeat runs of one syscall the next source of
		// a full-period sequence and tail-calls the program, so no source
		// repeats in 2^32 packets and no run pays the syscall. Since no
		// source is seen twice, the new-source filter, probed first,
		// keeps every one of them away from the table (no lookup, no
		// insert, no eviction). ns/pkt includes the feeder and its tail
		// call, reported alone as feeder-ns/pkt.
		//
		// small-direct-x is what the IPv4 direct table would cost this
		// flood with a small policy (the reason for its 1,024-fact
		// threshold): the same case on a datapath whose generation is
		// given a table anyway (no facts: every lookup is one level-1
		// load), timed in alternating chunks against a twin datapath on
		// the trie, as the ratio of their times; small-direct-ns/pkt is
		// its own time. Both are fresh datapaths fed the same number of
		// sources, so their new-source filters hold the same number of
		// marks (comparing against this case's datapath, which has seen
		// millions more sources, would measure filter fill instead).
		cached(b, "random_src", func(b *testing.B) *benchCase {
			bd := loadBench(b, bigSrcSizes)
			bd.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{generousRule(0)}})
			fillSrc(b, bd, 1, 1<<20)
			feed := newSourceFeeder(b, bd.prog(), ebpf.AttachXDP)
			alone := newSourceFeeder(b, bareDrop(b), ebpf.AttachNone)
			c := &benchCase{prog: feed.prog, frames: [][]byte{benchFrame(src4(1))}, want: xdpPass, warm: true,
				advance: advanceSource, feeders: []*sourceFeeder{feed, alone}}

			twin := func(minFacts int, wantDirect bool) *benchDatapath {
				t := loadBench(b, bigSrcSizes)
				t.m.Generations.SetV4DirectMinFacts(minFacts)
				t.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{generousRule(0)}})
				if got := t.m.Generations.V4Direct().Used; got != wantDirect {
					b.Fatalf("ipv4 direct table in use: %v, want %v (%+v)", got, wantDirect, t.m.Generations.V4Direct())
				}
				fillSrc(b, t, 1, 1<<20)
				return t
			}
			direct, trie := twin(0, true), twin(math.MaxInt, false)
			trieRun := &newSourceRun{feed: newSourceFeeder(b, trie.prog(), ebpf.AttachXDP),
				frame: benchFrame(netip.MustParseAddr("203.0.113.1")), advance: advanceSource}
			directRun := &newSourceRun{feed: newSourceFeeder(b, direct.prog(), ebpf.AttachXDP),
				frame: benchFrame(netip.MustParseAddr("203.0.113.1")), advance: advanceSource}
			c.feeders = append(c.feeders, trieRun.feed, directRun.feed)
			trieRun.run(b, 1)
			directRun.run(b, 1)
			var directNs float64 // from the last small-direct-x measurement
			c.extras = []extraMetric{
				{"feeder-ns/pkt", func(b *testing.B) float64 {
					return float64(steadyRun(b, alone.prog, benchFrame(src4(1)), 1<<20).Nanoseconds())
				}},
				{"small-direct-x", func(b *testing.B) float64 {
					var trie, direct time.Duration
					for range 4 {
						trie += trieRun.run(b, 1<<18)
						direct += directRun.run(b, 1<<18)
					}
					directNs = float64(direct.Nanoseconds()) / 4
					return float64(direct) / float64(trie)
				}},
				{"small-direct-ns/pkt", func(b *testing.B) float64 { return directNs }},
			}
			return c
		}).measure(b)
	})
}

var bigSrcSizes = loader.Sizes{MaxRules: 64, SrcEntries: 1 << 20, AggEntries: 4096, PrefixEntries: 4096, ListEntries: 1024, L4Entries: 64}

// fillSrc puts n fresh per-source buckets of rule id into the table, for
// sources spread(0) to spread(n-1), and returns their keys.
func fillSrc(b *testing.B, bd *benchDatapath, id uint32, n int) []loader.LimiterEgSrcKey {
	keys := make([]loader.LimiterEgSrcKey, n)
	vals := make([]loader.LimiterEgSrcBucket, n)
	for i := range keys {
		keys[i] = loader.LimiterEgSrcKey{RuleId: id, Addr: maps.Addr16(spread(uint32(i)))}
	}
	if _, err := bd.d.Objects.SrcBuckets.BatchUpdate(keys, vals, nil); err != nil {
		b.Fatalf("prefill src_buckets: %v", err)
	}
	return keys
}

func pass1MKeys(b *testing.B) *benchCase {
	const filled = 1_000_000
	bd := loadBench(b, bigSrcSizes)
	bd.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{generousRule(0)}})
	keys := fillSrc(b, bd, 0, filled)
	frames := make([][]byte, 1<<16)
	var v loader.LimiterEgSrcBucket
	for i := range frames {
		k := keys[i*(filled/len(frames))]
		if err := bd.d.Objects.SrcBuckets.Lookup(k, &v); err != nil {
			b.Fatalf("prefilled source %d missing (evicted?): %v", i, err)
		}
		frames[i] = benchFrame(netip.AddrFrom16(k.Addr).Unmap())
	}
	c := &benchCase{prog: bd.prog(), frames: frames, repeat: 256, want: xdpPass, timer: true}
	c.extras = []extraMetric{
		{"cold-ns/run", func(b *testing.B) float64 {
			// The new-source filter answers a source it has not seen in
			// this epoch or the last without a table lookup: mark every
			// source first (untimed), so that each timed run looks its
			// bucket up, as an active source's packet does.
			for i := 0; i < min(singleRunCount, len(frames)); i++ {
				if _, _, err := c.prog.Benchmark(frames[i], 1, nil); err != nil {
					b.Fatal(err)
				}
			}
			return singleRuns(b, c.prog, frames)
		}},
		{"hit-1run-ns", func(b *testing.B) float64 { return singleRuns(b, c.prog, frames[:1]) }},
	}
	return c
}

// aggregateDropCase is drop_prefix and drop_whole: the default rule's
// aggregate (mode: a derived /16, or whole) is over budget, and frames come
// from the 65,536 sources of 198.18.0.0/16, 256 runs each.
func aggregateDropCase(b *testing.B, mode policy.AggregateMode) *benchCase {
	bd := loadBench(b, smallSizes)
	r := generousRule(0)
	r.Aggregate = mode
	if mode == policy.AggregateDerived {
		r.AggregateKey = policy.KeyBits{V4: 16, V6: 48}
	}
	r.PerPrefix = policy.Bucket{Packets: onePerHour}
	bd.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{r}})
	frames := make([][]byte, 1<<16)
	for i := range frames {
		frames[i] = benchFrame(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}))
	}
	return &benchCase{prog: bd.prog(), frames: frames, repeat: 256, want: xdpDrop}
}

func passCase(b *testing.B) *benchCase {
	bd := loadBench(b, smallSizes)
	bd.apply(policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: []policy.CompiledRule{generousRule(0)}})
	return &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: xdpPass}
}

// rules100k loads 100,000 prefix rules and 500,000 ASN prefix facts (a full
// routing table's worth of ASN data). Every rule is a /28 inside one of the
// ASN /24s; the rule has the same buckets as "pass". With that many facts
// the generation gets an IPv4 direct table (the set-up fails if not); the
// frame's /28 costs level 1 and three chunks, one short of a /32.
//
// Extra metrics: x-pass (see BenchmarkDataPlane), and a new source on every
// packet against the same policy, with the direct table (new-src-ns/pkt)
// and with the trie (new-src-trie-ns/pkt), measured as random_src is (full
// 2^20 per-source table, source feeder) on two more datapaths, in
// alternating chunks. Their sources run through 4.0.0.0/6, all inside the
// ASN /24s, a fifth of those /24s holding a rule /28: a direct-table lookup
// there takes level 1 and two or three chunks.
func rules100k(b *testing.B) *benchCase {
	const hit = 77_777 // the rule the benchmark frame falls into
	bd := loadBench(b, loader.Sizes{MaxRules: 1 << 17, SrcEntries: 1 << 16, AggEntries: 4096, PrefixEntries: 1 << 20, ListEntries: 1024, L4Entries: 64})
	bd.apply(policy100k())
	if st := bd.m.Generations.V4Direct(); !st.Used {
		b.Fatalf("ipv4 direct table not in use: %+v", st)
	} else {
		b.Logf("ipv4 direct table: %d facts, %d of %d chunks", st.Facts, st.Chunks, st.Capacity)
	}
	src := asn24(5 * hit).As4()
	src[3] = 9
	c := &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(netip.AddrFrom4(src))}, want: xdpPass}
	pass := cached(b, "pass", passCase)

	newSrc := []*newSourceRun{newSources100k(b, true), newSources100k(b, false)}
	var newSrcNs [2]float64 // direct, trie: from the last measurement
	c.extras = []extraMetric{
		{"x-pass", func(b *testing.B) float64 {
			var rules, base time.Duration
			for range 20 {
				rules += steadyRun(b, c.prog, c.frames[0], 1<<17)
				base += steadyRun(b, pass.prog, pass.frames[0], 1<<17)
			}
			return float64(rules) / float64(base)
		}},
		{"new-src-ns/pkt", func(b *testing.B) float64 {
			var sum [2]time.Duration
			for range 4 {
				for i, r := range newSrc {
					sum[i] += r.run(b, 1<<18)
				}
			}
			for i := range sum {
				newSrcNs[i] = float64(sum[i].Nanoseconds()) / 4
			}
			return newSrcNs[0]
		}},
		{"new-src-trie-ns/pkt", func(b *testing.B) float64 { return newSrcNs[1] }},
	}
	return c
}

// asn24 is the address of ASN /24 number i of policy100k: 1.0.0.0 + i*256.
func asn24(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(1 + i>>16), byte(i >> 8), byte(i), 0})
}

// policy100k is rules_100k's policy: rules 0 (default) to 100,000, and
// 500,000 ASN /24 facts, rule j being the first /28 of ASN /24 number 5j.
func policy100k() policy.Compiled {
	const (
		nRules = 100_000
		nASN   = 500_000
	)
	rules := make([]policy.CompiledRule, 0, nRules+1)
	for id := uint32(0); id <= nRules; id++ {
		rules = append(rules, generousRule(id))
	}
	asnOf := func(i int) uint32 { return 64512 + uint32(i%1000) }
	facts := make([]policy.PrefixFact, 0, nASN+nRules)
	for i := 0; i < nASN; i++ {
		facts = append(facts, policy.PrefixFact{Prefix: netip.PrefixFrom(asn24(i), 24), ASN: asnOf(i), Country: [2]byte{'Z', 'Z'}})
	}
	for j := 1; j <= nRules; j++ {
		facts = append(facts, policy.PrefixFact{Prefix: netip.PrefixFrom(asn24(5*j), 28), RuleID: uint32(j), ASN: asnOf(5 * j), Country: [2]byte{'Z', 'Z'}})
	}
	return policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: rules, Prefixes: facts}
}

// newSourceRun is a datapath fed a new source on every packet.
type newSourceRun struct {
	feed    *sourceFeeder
	frame   []byte
	advance func(frame []byte, runs int)
}

// newSources100k loads policy100k with (direct) or without the IPv4 direct
// table on a datapath set up like random_src's (2^20 per-source table
// filled under an id no rule has), fed sources from 4.0.0.0/6.
func newSources100k(b *testing.B, direct bool) *newSourceRun {
	in := netip.MustParsePrefix("4.0.0.0/6")
	bd := loadBench(b, loader.Sizes{MaxRules: 1 << 17, SrcEntries: 1 << 20, AggEntries: 4096, PrefixEntries: 1 << 20, ListEntries: 1024, L4Entries: 64})
	if !direct {
		bd.m.Generations.SetV4DirectMinFacts(math.MaxInt)
	}
	bd.apply(policy100k())
	if got := bd.m.Generations.V4Direct().Used; got != direct {
		b.Fatalf("ipv4 direct table in use: %v, want %v", got, direct)
	}
	fillSrc(b, bd, 1<<20, 1<<20)
	r := &newSourceRun{
		feed:    newSourceFeederIn(b, bd.prog(), ebpf.AttachXDP, in),
		frame:   benchFrame(netip.MustParseAddr("4.0.0.1")),
		advance: advanceSourceIn(in),
	}
	r.run(b, 1) // untimed warm-up
	return r
}

// run is the kernel's mean time per packet over n packets, each from a new
// source.
func (r *newSourceRun) run(b *testing.B, n int) time.Duration {
	ret, d, err := r.feed.prog.Benchmark(r.frame, n, nil)
	if err != nil {
		b.Fatal(err)
	}
	if ret != xdpPass {
		b.Fatalf("new source: verdict %d, want XDP_PASS", ret)
	}
	r.advance(r.frame, n)
	return d
}

// steadyRun is the kernel's mean time per run over n runs of one frame.
func steadyRun(b *testing.B, p *ebpf.Program, frame []byte, n int) time.Duration {
	_, d, err := p.Benchmark(frame, n, nil)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// benchCase is one benchmark's program and frames, built once per process
// (b.Run calls a sub-benchmark several times while it sizes b.N).
type benchCase struct {
	prog   *ebpf.Program
	frames [][]byte
	repeat int // runs per frame per syscall; 0: as many as b.N allows, up to maxRepeat
	want   uint32
	timer  bool // also report the test runner's fixed cost of a single run
	// advance, if set, is called after every syscall with the runs it
	// made, to carry into the next call what the program changed in its
	// copy of the frame (the source feeder's position).
	advance func(frame []byte, runs int)
	// feeders keeps the source feeders' program arrays open: the kernel
	// empties a program array when its last file descriptor closes.
	feeders []*sourceFeeder
	extras  []extraMetric // reported after the main measurement
	warm    bool          // warm-up done (or not wanted)
	next    int
}

// extraMetric is a second measurement of the same case that explains the
// first.
type extraMetric struct {
	unit string
	run  func(b *testing.B) float64
}

const maxRepeat = 1 << 20

// measure runs b.N packets and reports the kernel's time per packet.
func (c *benchCase) measure(b *testing.B) {
	if !c.warm {
		// Untimed, once: the first packet of a source creates its
		// bucket (and, in the drop cases, spends the only token).
		for _, f := range c.frames {
			if _, _, err := c.prog.Benchmark(f, 1, nil); err != nil {
				b.Fatalf("warm-up run: %v", err)
			}
		}
		c.warm = true
	}
	var total time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		frame := c.frames[c.next%len(c.frames)]
		c.next++
		n := c.repeat
		if n == 0 {
			n = maxRepeat
		}
		n = min(n, b.N-done)
		ret, per, err := c.prog.Benchmark(frame, n, nil)
		if err != nil {
			b.Fatalf("prog test run: %v", err)
		}
		if ret != c.want {
			b.Fatalf("verdict %d, want %d (frame %d)", ret, c.want, c.next-1)
		}
		if c.advance != nil {
			c.advance(frame, n)
		}
		total += per * time.Duration(n)
		done += n
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/pkt")
	if c.timer {
		bare := bareDrop(b)
		b.ReportMetric(singleRuns(b, bare, c.frames[:1]), "timer-ns/run")
		bare.Close()
	}
	for _, e := range c.extras {
		b.ReportMetric(e.run(b), e.unit)
	}
}

// singleRunCount is how many single runs a secondary metric averages.
const singleRunCount = 20000

// singleRuns is the mean time BPF_PROG_TEST_RUN reports for one run per
// syscall, cycling through frames. For a program that does nothing it is
// the runner's own fixed cost.
func singleRuns(b *testing.B, p *ebpf.Program, frames [][]byte) float64 {
	var total time.Duration
	for i := 0; i < singleRunCount; i++ {
		_, d, err := p.Benchmark(frames[i%len(frames)], 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		total += d
	}
	return float64(total.Nanoseconds()) / singleRunCount
}

// benchCases lives for the test binary: each sub-benchmark's set-up (a
// million-entry prefill takes seconds) runs once, not once per b.N probe.
// Benchmarks run one at a time, so no lock is needed. The datapaths are
// never closed; they go with the process.
var benchCases = map[string]*benchCase{}

func cached(b *testing.B, name string, build func(*testing.B) *benchCase) *benchCase {
	b.Helper()
	if c, ok := benchCases[name]; ok {
		return c
	}
	c := build(b)
	benchCases[name] = c
	return c
}

// benchDatapath is a datapath on the kernel clock.
type benchDatapath struct {
	tb testing.TB
	d  *loader.Datapath
	m  *maps.Maps
}

func loadBench(tb testing.TB, sizes loader.Sizes) *benchDatapath {
	tb.Helper()
	d, err := loader.Load(loader.Options{Sizes: sizes})
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	return &benchDatapath{tb: tb, d: d, m: maps.New(d)}
}

func (bd *benchDatapath) apply(g policy.Compiled) {
	bd.tb.Helper()
	if err := mapstest.StageCommit(bd.m, &g); err != nil {
		bd.tb.Fatalf("apply: %v", err)
	}
}

func (bd *benchDatapath) prog() *ebpf.Program { return bd.d.Objects.XdpLimiter }

// bareDrop is the floor: an XDP program that returns XDP_DROP and nothing
// else. The caller closes it (the floor case keeps it for the process).
func bareDrop(tb testing.TB) *ebpf.Program {
	tb.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "bare_drop", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		tb.Fatalf("load bare xdp program: %v", err)
	}
	return p
}

// onePerHour keeps a bucket exhausted after its single token for the whole
// benchmark; 10^9/s never runs out at a few tens of Mpps.
var (
	onePerHour = policy.Limit{Rate: policy.Rate{Count: 1, Per: time.Hour}, Burst: 1}
	generous   = policy.Limit{Rate: policy.Rate{Count: 1_000_000_000, Per: time.Second}, Burst: 1_000_000_000}
)

func generousRule(id uint32) policy.CompiledRule {
	return policy.CompiledRule{ID: id, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: generous}}
}

func enforce() policy.Compiled {
	return policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass}
}

// ipv4SrcOffset is where the IPv4 source address sits in benchFrame.
const ipv4SrcOffset = 14 + 12

// benchFrame is a 64-byte UDP/IPv4 frame (22 bytes of payload) from src.
// random_src rewrites the source in place without fixing the IPv4
// checksum: the program does not verify it.
func benchFrame(src netip.Addr) []byte {
	return packet.Frame{Src: src, Proto: packet.ProtoUDP, SrcPort: 40000, DstPort: 53, Payload: 22}.Build()
}

func src4(host byte) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, host}) }

// spread maps i to an IPv4 address by a bijection of the 32-bit space
// (multiplication by an odd constant), so consecutive i land far apart in
// the hash table and never repeat.
func spread(i uint32) netip.Addr {
	x := i * 2654435761
	return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
}

// congestedCase is a policy whose default rule has a whole aggregate of
// 1,000/s with a burst of 10^9 and a 50% reserve, standing on, and the
// aggregate's bucket set three quarters full: inside the reserve band,
// where it stays for the whole benchmark (each admitted packet adds 1 ms of
// the 10^6 s tolerance, and time drains it at the same pace).
func congestedCase(b *testing.B, established bool) *benchCase {
	return congestedWith(b, established, policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: 5 * time.Minute}, nil)
}

// congestedBudgetCase is congestedCase's established source with personal
// budgets on (headroom 2, default 10^9/s: no mean, so the default), within
// its budget or over it (its budget's GCRA word an hour ahead).
func congestedBudgetCase(b *testing.B, over bool) *benchCase {
	st := policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: 5 * time.Minute, PersonalHeadroom: 2,
		PersonalDefault: policy.Rate{Count: 1_000_000_000, Per: time.Second}, PersonalBurstSeconds: 2}
	return congestedWith(b, true, st, func(bd *benchDatapath, now uint64) uint32 {
		if !over {
			return xdpPass
		}
		k := maps.StandingKey(src4(1))
		var v loader.LimiterEgStandingVal
		if err := bd.d.Objects.Standing.Lookup(k, &v); err != nil {
			b.Fatal(err)
		}
		v.BudgetTat = now + uint64(time.Hour)<<uint64(loader.LimiterEgShiftsEG_SHIFT_TICK)
		if err := bd.d.Objects.Standing.Put(k, v); err != nil {
			b.Fatal(err)
		}
		return xdpDrop
	})
}

// congestedWith builds congestedCase with the standing settings st; then,
// for an established source, adjust may change its entry (now is the
// clock in ticks) and says the verdict to expect.
func congestedWith(b *testing.B, established bool, st policy.Standing, adjust func(bd *benchDatapath, now uint64) uint32) *benchCase {
	bd := loadBench(b, smallSizes)
	r := generousRule(0)
	r.Aggregate = policy.AggregateWhole
	r.PerPrefix = policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: 1000, Per: time.Second}, Burst: 1_000_000_000}}
	r.Reserve = 500_000
	bd.apply(policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Rules:     []policy.CompiledRule{r},
		Standing:  st,
	})
	cfg, err := maps.BucketConfig(r.PerPrefix)
	if err != nil {
		b.Fatal(err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		b.Fatal(err)
	}
	tat := uint64(ts.Nano())<<uint64(loader.LimiterEgShiftsEG_SHIFT_TICK) + cfg.PktTau/4*3
	if err := bd.d.Objects.WholeBuckets.Put(uint32(0), loader.LimiterEgBucket{PktTat: tat}); err != nil {
		b.Fatal(err)
	}
	want := uint32(xdpDrop)
	if established {
		if err := bd.m.Standing.Set(src4(1), maps.StandingEstablished); err != nil {
			b.Fatal(err)
		}
		want = xdpPass
		if adjust != nil {
			want = adjust(bd, uint64(ts.Nano())<<uint64(loader.LimiterEgShiftsEG_SHIFT_TICK))
		}
	}
	return &benchCase{prog: bd.prog(), frames: [][]byte{benchFrame(src4(1))}, want: want}
}
