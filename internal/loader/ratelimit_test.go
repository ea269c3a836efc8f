package loader_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// TestPerSourceRateExact checks "R/s with burst B" exactly on the test
// clock: B packets at once, then one per 1/R, never more.
func TestPerSourceRateExact(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: perSecond(100, 10)}}))
	frame := packet.UDP4("198.18.1.1", 1000, 53, 32)

	td.setClock(time.Hour)
	passed := 0
	for i := 0; i < 50; i++ {
		if td.run(frame) == xdpPass {
			passed++
		}
	}
	if passed != 10 {
		t.Fatalf("burst: passed %d of 50 at one instant, want exactly 10", passed)
	}
	// 1 second later: exactly 100 more tokens (capped at the burst of 10
	// when idle, so send them spread at 10ms intervals).
	for step := 1; step <= 100; step++ {
		td.setClock(time.Hour + time.Duration(step)*10*time.Millisecond)
		got := 0
		for i := 0; i < 3; i++ {
			if td.run(frame) == xdpPass {
				got++
			}
		}
		if got != 1 {
			t.Fatalf("step %d: passed %d, want exactly 1 per 10ms at 100/s", step, got)
		}
	}
	c := td.counters()
	if p := c.Get(maps.ActPass, maps.ReasonOK).Packets; p != 110 {
		t.Errorf("pass/ok counter = %d, want 110", p)
	}
	if d := c.Get(maps.ActDrop, maps.ReasonSrcLimit).Packets; d != 40+200 {
		t.Errorf("drop/source_limit counter = %d, want 240", d)
	}
}

// TestGlobalRateAcrossCPUs sends packets from every CPU at the same frozen
// instant: the total admitted must equal the burst, not burst × CPUs.
func TestGlobalRateAcrossCPUs(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	g := defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}})
	g.Global = policy.Bucket{Packets: perSecond(1000, 500)}
	td.apply(g)
	td.setClock(time.Hour)

	cpus := runtime.NumCPU()
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for cpu := 0; cpu < cpus; cpu++ {
		wg.Add(1)
		go func(cpu int) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Errorf("pin to cpu %d: %v", cpu, err)
				return
			}
			n := 0
			for i := 0; i < 2000; i++ {
				src := []string{"198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"}[i%4]
				if td.run(packet.UDP4(src, 1000, 53, 0)) == xdpPass {
					n++
				}
			}
			mu.Lock()
			passed += n
			mu.Unlock()
		}(cpu)
	}
	wg.Wait()
	if passed != 500 {
		t.Fatalf("%d CPUs admitted %d packets at one instant, want exactly the burst 500", cpus, passed)
	}
}

// TestNewSourceFilter: sources seen once per epoch get no bucket (a spoofed
// flood cannot churn the table), a source seen twice gets one that already
// holds its first packet (so bursts stay exact), and a rule slower than one
// packet per epoch is not filtered at all.
func TestNewSourceFilter(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Rules: []policy.CompiledRule{
			{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: perSecond(100, 3)}},
			{ID: 1, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: 1, Per: time.Minute}, Burst: 1}}},
		},
		Prefixes: []policy.PrefixFact{{Prefix: netip.MustParsePrefix("198.19.0.0/16"), RuleID: 1}},
	})
	td.setClock(time.Hour)
	for i := 0; i < 500; i++ {
		if td.run(packet.UDP4(fmt.Sprintf("198.18.%d.%d", i/250, 1+i%250), 1000, 53, 0)) != xdpPass {
			t.Fatal("a first packet was dropped")
		}
	}
	occ, err := td.m.Counters.Tables()
	if err != nil {
		t.Fatal(err)
	}
	// Filter collisions may give a few sources a bucket early: 500 keys in
	// 1024 words of 28 bits per epoch collide rarely.
	if n := occ["sources"].Entries; n > 10 {
		t.Errorf("500 one-packet sources created %d buckets, want about none", n)
	}
	// A burst from one source at one instant: exactly the burst of 3.
	passed := 0
	for i := 0; i < 10; i++ {
		if td.run(packet.UDP4("198.18.9.9", 1000, 53, 0)) == xdpPass {
			passed++
		}
	}
	if passed != 3 {
		t.Errorf("burst 3 through the filter: %d passed", passed)
	}
	// A slow rule (1/min) is not filtered: its second packet is limited.
	slow := packet.UDP4("198.19.0.1", 1000, 53, 0)
	if td.run(slow) != xdpPass || td.run(slow) != xdpDrop {
		t.Error("1/min rule: want the first packet passed and the second dropped")
	}
}

// TestNewSourceFilterAcrossEpochs: the filter lets a key's first packet in
// an epoch through without a bucket lookup only when the key was not seen
// in the epoch before, and charges it with the key's next packet. So a
// source sending steadily across many epochs is held to its rate exactly,
// and a source back after a long pause gets exactly its burst.
func TestNewSourceFilterAcrossEpochs(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: perSecond(10, 3)}}))
	frame := packet.UDP4("198.18.1.1", 1000, 53, 0)
	const epoch = time.Duration(1) << 30 // EG_SEEN_EPOCH_SHIFT, in ns
	start := 100 * epoch
	burst := func(at time.Duration, n int) int {
		td.setClock(at)
		passed := 0
		for range n {
			if td.run(frame) == xdpPass {
				passed++
			}
		}
		return passed
	}
	if got := burst(start, 10); got != 3 {
		t.Fatalf("first burst: %d passed, want the burst of 3", got)
	}
	// Steady: two tries every 100 ms (10/s) for 8 epochs: exactly one
	// passes each time, including right after every epoch boundary.
	at := start
	for step := 1; at < start+8*epoch; step++ {
		at = start + time.Duration(step)*100*time.Millisecond
		if got := burst(at, 2); got != 1 {
			t.Fatalf("step %d (%.2f epochs in): %d of 2 passed, want exactly 1 at 10/s", step, float64(at-start)/float64(epoch), got)
		}
	}
	// A pause of three epochs, then a burst: the first packet goes
	// through unlooked-up, the second settles its charge; 3 in all.
	if got := burst(at+3*epoch, 10); got != 3 {
		t.Fatalf("burst after a pause: %d passed, want the burst of 3", got)
	}
	if got := burst(at+3*epoch+100*time.Millisecond, 3); got != 1 {
		t.Fatalf("100 ms after that burst: %d passed, want 1", got)
	}
}
