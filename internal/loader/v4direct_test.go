package loader_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// The IPv4 direct table must answer exactly like the prefix trie. These
// tests read the program's answer (rule slot and ASN) from drop samples:
// every rule drops, so every packet with a rule is sampled with the rule
// slot and ASN the lookup found; a packet whose fact names a missing rule
// passes as no_policy, unsampled.

var probeSizes = loader.Sizes{MaxRules: 64, SrcEntries: 1024, AggEntries: 1024, PrefixEntries: 4096, ListEntries: 64, L4Entries: 16, V4Chunks: 4096}

// probeRules are the rule ids facts name: 0-15 exist (slot == id), 40
// does not.
const (
	probeRuleCount = 16
	probeMissing   = 40
)

// factAnswer is what the program made of one source.
type factAnswer struct {
	xdp     uint32
	sampled bool
	rule    uint32 // table slot
	asn     uint32
}

func (a factAnswer) String() string {
	if !a.sampled {
		return fmt.Sprintf("xdp %d, no sample", a.xdp)
	}
	return fmt.Sprintf("xdp %d, rule slot %d, asn %d", a.xdp, a.rule, a.asn)
}

type factProbe struct {
	td      *testDatapath
	samples *maps.SampleReader
}

func newFactProbe(t *testing.T, td *testDatapath) *factProbe {
	t.Helper()
	td.setClock(t0)
	r, err := td.m.Samples.NewDropReader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &factProbe{td: td, samples: r}
}

// probeGen is a policy where every rule drops (and is sampled) and facts
// decide the rule and ASN.
func probeGen(facts []policy.PrefixFact) policy.Compiled {
	rules := make([]policy.CompiledRule, probeRuleCount)
	for i := range rules {
		rules[i] = policy.CompiledRule{ID: uint32(i), SourceKey: policy.KeyBits{V4: 32, V6: 64}, Action: policy.ActionDrop}
	}
	return policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Samples:   policy.Limit{Rate: policy.Rate{Count: 1_000_000_000, Per: time.Second}, Burst: 1_000_000_000},
		Rules:     rules,
		Prefixes:  facts,
	}
}

// apply applies g with a direct table when direct is set, and checks that
// the program got what was asked for.
func (p *factProbe) apply(t *testing.T, g policy.Compiled, direct bool) {
	t.Helper()
	if direct {
		p.td.m.Generations.SetV4DirectMinFacts(0)
	} else {
		p.td.m.Generations.SetV4DirectMinFacts(math.MaxInt)
	}
	p.td.apply(g)
	if st := p.td.m.Generations.V4Direct(); st.Used != direct {
		t.Fatalf("direct table used = %v, want %v (%+v)", st.Used, direct, st)
	}
	if got := p.configFlag(t); got != direct {
		t.Fatalf("config v4_direct = %v, want %v", got, direct)
	}
}

// configFlag reads the live generation's v4_direct flag.
func (p *factProbe) configFlag(t *testing.T) bool {
	t.Helper()
	gen, err := p.td.m.Generations.Active()
	if err != nil {
		t.Fatal(err)
	}
	var cfg loader.LimiterEgConfig
	if err := p.td.d.Objects.Configs.Lookup(gen, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.V4Direct != 0
}

func (p *factProbe) ask(t *testing.T, src netip.Addr) factAnswer {
	t.Helper()
	frame := packet.Frame{Src: src, Proto: packet.ProtoUDP, SrcPort: 40000, DstPort: 53, Payload: 8}.Build()
	a := factAnswer{xdp: p.td.run(frame)}
	// A deadline in the past makes Read non-blocking. The reader may
	// report a deadline noticed on an earlier call before looking at the
	// ring, so a miss is asked twice.
	for range 2 {
		p.samples.SetDeadline(time.Now())
		s, err := p.samples.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if s.Source != src {
			t.Fatalf("sample from %s, sent %s", s.Source, src)
		}
		a.sampled, a.rule, a.asn = true, s.RuleSlot, s.ASN
		break
	}
	return a
}

// randV4Facts makes nested, overlapping IPv4 prefixes of every length
// (0-32), rule facts and ASN-only facts, some naming a missing rule, some
// keys twice, plus IPv6 facts that cover (or not) the IPv4-mapped range.
func randV4Facts(r *rand.Rand) []policy.PrefixFact {
	var facts []policy.PrefixFact
	val := func(p netip.Prefix) policy.PrefixFact {
		f := policy.PrefixFact{Prefix: p}
		switch r.IntN(4) {
		case 0: // ASN data only
			f.ASN = 64512 + uint32(r.IntN(100))
		case 1: // rule and ASN
			f.RuleID, f.ASN = uint32(r.IntN(probeRuleCount)), 64512+uint32(r.IntN(100))
		case 2:
			f.RuleID = uint32(r.IntN(probeRuleCount))
		case 3:
			f.RuleID = pick(r, uint32(probeMissing), 0, 1)
		}
		return f
	}
	randPrefix := func(within netip.Prefix) netip.Prefix {
		bits := within.Bits() + r.IntN(33-within.Bits())
		a := within.Addr().As4()
		x := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		if within.Bits() < 32 {
			x |= r.Uint32() & (1<<(32-within.Bits()) - 1)
		}
		p, _ := netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}).Prefix(bits)
		return p
	}
	// A few roots, each with a random nest of prefixes under it.
	all := netip.MustParsePrefix("0.0.0.0/0")
	for range 1 + r.IntN(4) {
		root := randPrefix(netip.PrefixFrom(all.Addr(), r.IntN(20)))
		facts = append(facts, val(root))
		parent := root
		for range 2 + r.IntN(12) {
			if r.IntN(3) == 0 {
				parent = root
			}
			p := randPrefix(parent)
			facts = append(facts, val(p))
			parent = p
		}
	}
	// Lengths 0, 16 and 32 and neighbours of the level boundaries.
	for _, bits := range []int{0, 1, 15, 16, 17, 19, 20, 21, 24, 27, 28, 29, 31, 32} {
		if r.IntN(3) == 0 {
			p, _ := randPrefix(all).Addr().Prefix(bits)
			facts = append(facts, val(p))
		}
	}
	// The same key twice: the trie keeps the last.
	if r.IntN(2) == 0 {
		f := facts[r.IntN(len(facts))]
		facts = append(facts, val(f.Prefix))
	}
	// IPv6 facts: the trie answers IPv4 sources with ::/0, ::/80 or
	// ::ffff:0:0/96 where no IPv4 fact covers them; others never apply.
	v6 := []string{"::/0", "::/64", "::/80", "::/81", "fd00::/16", "::ffff:0:0/96", "::ffff:198.18.0.0/112"}
	for _, s := range v6 {
		if r.IntN(2) == 0 {
			facts = append(facts, val(netip.MustParsePrefix(s)))
		}
	}
	r.Shuffle(len(facts), func(i, j int) { facts[i], facts[j] = facts[j], facts[i] })
	return facts
}

// probeAddrs are the sources to ask about: for every IPv4 prefix its first
// and last address and their outer neighbours, one inside it, and random
// addresses.
func probeAddrs(r *rand.Rand, facts []policy.PrefixFact) []netip.Addr {
	out := []netip.Addr{netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("198.18.0.1")}
	u32 := func(a netip.Addr) uint32 {
		b := a.As4()
		return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	}
	from := func(x uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	for _, f := range facts {
		p := f.Prefix.Masked()
		if !p.Addr().Is4() && !p.Addr().Is4In6() {
			continue
		}
		if p.Addr().Is4In6() {
			if p.Bits() < 96 {
				continue
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		first := u32(p.Addr())
		last := first | uint32(uint64(1)<<(32-p.Bits())-1)
		out = append(out, from(first), from(last), from(first-1), from(last+1), from(first+uint32(r.Uint64N(uint64(last-first)+1))))
	}
	for range 64 {
		out = append(out, from(r.Uint32()))
	}
	return out
}

func TestV4DirectAnswersLikeTrie(t *testing.T) {
	td := newTestDatapath(t, probeSizes)
	p := newFactProbe(t, td)
	kinds := map[string]int{}
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			td.tb = t
			r := rand.New(rand.NewPCG(seed, 0x7a1e))
			facts := randV4Facts(r)
			addrs := probeAddrs(r, facts)
			g := probeGen(facts)

			// Alternate which goes first, so that tables are built in
			// both generations' halves.
			askAll := func(direct bool) []factAnswer {
				p.apply(t, g, direct)
				out := make([]factAnswer, len(addrs))
				for i, a := range addrs {
					out[i] = p.ask(t, a)
				}
				return out
			}
			var want, got []factAnswer
			if seed%2 == 0 {
				got = askAll(true)
				want = askAll(false)
			} else {
				want = askAll(false)
				got = askAll(true)
			}
			for i, a := range addrs {
				got := got[i]
				if got != want[i] {
					t.Fatalf("source %s: direct table gives %s, trie %s\nfacts: %v", a, got, want[i], facts)
				}
				switch {
				case !got.sampled:
					kinds["missing rule"]++
				case got.rule != 0 && got.asn != 0:
					kinds["rule and asn"]++
				case got.asn != 0:
					kinds["asn only"]++
				case got.rule != 0:
					kinds["rule only"]++
				default:
					kinds["no fact"]++
				}
			}
		})
	}
	td.tb = t
	// The comparison proves little unless every kind of answer came up.
	for _, k := range []string{"missing rule", "rule and asn", "asn only", "rule only", "no fact"} {
		if kinds[k] == 0 {
			t.Errorf("no source got the answer %q", k)
		}
	}
	t.Logf("answers compared: %v", kinds)
}

// threeSixteens need one chunk each: three /20 facts in different /16s.
var threeSixteens = []policy.PrefixFact{
	{Prefix: netip.MustParsePrefix("198.18.16.0/20"), RuleID: 1, ASN: 64501},
	{Prefix: netip.MustParsePrefix("198.19.32.0/20"), RuleID: 2, ASN: 64502},
	{Prefix: netip.MustParsePrefix("203.0.112.0/20"), RuleID: 3, ASN: 64503},
	{Prefix: netip.MustParsePrefix("198.0.0.0/8"), RuleID: 4},
}

func TestV4DirectFallsBackWhenOverBudget(t *testing.T) {
	requireRoot(t)
	var logs bytes.Buffer
	sizes := probeSizes
	sizes.V4Chunks = 2
	d, err := loader.Load(loader.Options{Sizes: sizes, TestClock: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	td := &testDatapath{tb: t, d: d, m: maps.New(d)}
	p := newFactProbe(t, td)
	td.m.Generations.SetV4DirectMinFacts(0)

	check := func() {
		t.Helper()
		for src, want := range map[string]factAnswer{
			"198.18.16.1":  {xdp: xdpDrop, sampled: true, rule: 1, asn: 64501},
			"198.18.15.1":  {xdp: xdpDrop, sampled: true, rule: 4},
			"198.19.47.9":  {xdp: xdpDrop, sampled: true, rule: 2, asn: 64502},
			"203.0.113.77": {xdp: xdpDrop, sampled: true, rule: 3, asn: 64503},
			"203.0.128.1":  {xdp: xdpDrop, sampled: true},
		} {
			if got := p.ask(t, netip.MustParseAddr(src)); got != want {
				t.Errorf("source %s: %s, want %s", src, got, want)
			}
		}
	}

	// Two chunks: fits exactly.
	td.apply(probeGen(threeSixteens[1:]))
	if st := td.m.Generations.V4Direct(); !st.Used || st.Chunks != 2 || !p.configFlag(t) {
		t.Fatalf("two chunks in a budget of two: %+v, flag %v", st, p.configFlag(t))
	}
	// Three: the generation uses the trie, says so, and still answers.
	td.apply(probeGen(threeSixteens))
	st := td.m.Generations.V4Direct()
	if st.Used || p.configFlag(t) || st.Chunks <= st.Capacity || !strings.Contains(st.Reason, "more than 2 chunks") {
		t.Fatalf("three chunks in a budget of two: %+v, flag %v", st, p.configFlag(t))
	}
	if !strings.Contains(logs.String(), "does not fit") {
		t.Errorf("no warning logged; log:\n%s", logs.String())
	}
	check()
	// And back to a table that fits, in the other generation's half.
	td.apply(probeGen(threeSixteens[1:]))
	if st := td.m.Generations.V4Direct(); !st.Used {
		t.Fatalf("back to two chunks: %+v", st)
	}
}

// TestV4DirectSwapKeepsEnforcing swaps between generations with a direct
// table and without one, and with different tables in the same half, and
// checks every answer after each swap.
func TestV4DirectSwapKeepsEnforcing(t *testing.T) {
	td := newTestDatapath(t, probeSizes)
	p := newFactProbe(t, td)
	type want map[string]factAnswer
	drop := func(rule, asn uint32) factAnswer {
		return factAnswer{xdp: xdpDrop, sampled: true, rule: rule, asn: asn}
	}
	pass := factAnswer{xdp: xdpPass}
	steps := []struct {
		direct bool
		facts  []policy.PrefixFact
		want   want
	}{
		{true, []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.18.0.0/16"), RuleID: 1, ASN: 64501},
			{Prefix: netip.MustParsePrefix("198.18.5.0/24"), RuleID: probeMissing},
			{Prefix: netip.MustParsePrefix("198.18.5.128/25"), RuleID: 2},
		}, want{"198.18.0.1": drop(1, 64501), "198.18.5.1": pass, "198.18.5.200": drop(2, 0), "198.19.0.1": drop(0, 0)}},
		{false, []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.18.0.0/15"), RuleID: 3, ASN: 64503},
			{Prefix: netip.MustParsePrefix("198.18.5.0/24"), RuleID: 4},
		}, want{"198.18.0.1": drop(3, 64503), "198.18.5.1": drop(4, 0), "198.18.5.200": drop(4, 0), "198.19.0.1": drop(3, 64503)}},
		// Same half as the first step, different chunks: nothing of the
		// first table may show through.
		{true, []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.19.0.0/16"), RuleID: 5},
			{Prefix: netip.MustParsePrefix("198.18.5.0/28"), RuleID: probeMissing},
		}, want{"198.18.0.1": drop(0, 0), "198.18.5.1": pass, "198.18.5.200": drop(0, 0), "198.19.0.1": drop(5, 0)}},
		{true, nil, want{"198.18.0.1": drop(0, 0), "198.18.5.1": drop(0, 0), "198.19.0.1": drop(0, 0)}},
		{false, []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.18.5.0/24"), RuleID: probeMissing},
		}, want{"198.18.0.1": drop(0, 0), "198.18.5.1": pass}},
	}
	for i, s := range steps {
		p.apply(t, probeGen(s.facts), s.direct)
		for src, w := range s.want {
			if got := p.ask(t, netip.MustParseAddr(src)); got != w {
				t.Errorf("step %d (direct %v), source %s: %s, want %s", i, s.direct, src, got, w)
			}
		}
	}
}

// TestV4DirectSurvivesReopen: a generation's config says it uses the
// direct table, so the table is pinned with it; a datapath re-opened from
// the pins answers from the same table.
func TestV4DirectSurvivesReopen(t *testing.T) {
	requireRoot(t)
	pinDir := fmt.Sprintf("/sys/fs/bpf/eg-test-%d-v4direct", os.Getpid())
	t.Cleanup(func() { loader.Unpin(pinDir) })
	facts := []policy.PrefixFact{
		{Prefix: netip.MustParsePrefix("198.18.0.0/16"), RuleID: 1, ASN: 64501},
		{Prefix: netip.MustParsePrefix("198.18.5.7/32"), RuleID: 2, ASN: 64502},
	}
	open := func() *testDatapath { return openPinnedTestDatapath(t, probeSizes, pinDir) }
	want := map[string]factAnswer{
		"198.18.0.1": {xdp: xdpDrop, sampled: true, rule: 1, asn: 64501},
		"198.18.5.7": {xdp: xdpDrop, sampled: true, rule: 2, asn: 64502},
		"198.18.5.8": {xdp: xdpDrop, sampled: true, rule: 1, asn: 64501},
	}

	first := open()
	p := newFactProbe(t, first)
	p.apply(t, probeGen(facts), true)
	first.d.Close()

	second := open()
	p = newFactProbe(t, second)
	if !p.configFlag(t) {
		t.Fatal("re-opened datapath: live generation does not use the direct table")
	}
	// The trie must not be what answers: empty the live generation's trie.
	gen, err := second.m.Generations.Active()
	if err != nil {
		t.Fatal(err)
	}
	empty, err := second.d.NewPrefixTrie()
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if err := second.d.Objects.PrefixGens.Put(gen, empty); err != nil {
		t.Fatal(err)
	}
	for src, w := range want {
		if got := p.ask(t, netip.MustParseAddr(src)); got != w {
			t.Errorf("source %s after re-open: %s, want %s", src, got, w)
		}
	}
}
