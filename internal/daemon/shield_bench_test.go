package daemon

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

// samplePathFrames are the frames the benchmark's packets are: normal
// traffic from 2,048 sources of AS64501 (198.18/16) and AS64511 (198.20/16)
// to ports 443 and 53, lengths 60-1460; flood: half of them replaced by a
// UDP flood from 1,024 sources of AS64500 (198.19/16) to port 9999, 512
// bytes.
func samplePathFrames(flood bool) [][]byte {
	rng := rand.New(rand.NewPCG(12, 1))
	out := make([][]byte, 2048)
	for i := range out {
		src := fmt.Sprintf("198.18.%d.%d", rng.IntN(64), 1+rng.IntN(254))
		if i%3 == 0 {
			src = fmt.Sprintf("198.20.%d.%d", rng.IntN(64), 1+rng.IntN(254))
		}
		dport, size := uint16(443), 60+rng.IntN(1400)
		if i%5 == 0 {
			dport = 53
		}
		if flood && i%2 == 0 {
			src, dport, size = fmt.Sprintf("198.19.%d.%d", rng.IntN(4), 1+rng.IntN(254)), 9999, 512
		}
		out[i] = packet.UDP4(src, uint16(1024+rng.IntN(60000)), dport, size)
	}
	return out
}

// samplePath is one daemon with its 1-in-N sampler at one_in 1, the real
// ring buffer and reader, and the shield on.
type samplePath struct {
	d      *Daemon
	r      *maps.SampleReader
	frames [][]byte
	next   int
	now    time.Time
}

// fill runs the program on the next 64 frames, each repeated, until the
// sampler has sent about n samples (at most what the ring buffer holds)
// and returns how many it sent. One BPF_PROG_TEST_RUN per frame: each
// costs the kernel an XDP dispatcher update (synchronize_rcu), milliseconds
// on a loaded machine, so the samples come in runs of one frame's.
func (p *samplePath) fill(b *testing.B, n int) int {
	b.Helper()
	before, err := p.d.m.Samples.Counters()
	if err != nil {
		b.Fatal(err)
	}
	const frames = 64
	per := uint32((n + frames - 1) / frames)
	for range frames {
		f := p.frames[p.next%len(p.frames)]
		p.next++
		if _, err := p.d.dp.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: f, Repeat: per}); err != nil {
			b.Fatal(err)
		}
	}
	after, err := p.d.m.Samples.Counters()
	if err != nil {
		b.Fatal(err)
	}
	if after.Lost != before.Lost || after.Capped != before.Capped {
		b.Fatalf("the sampler lost %d and capped %d samples: the ring buffer or the cap is too small for a fill of %d",
			after.Lost-before.Lost, after.Capped-before.Capped, n)
	}
	return int(after.Sent - before.Sent)
}

// ringBatch is how many samples one fill writes: under the ring buffer's
// 16,383 records, so none is lost.
const ringBatch = 12000

// samplesPerInterval is how many samples make one second of the shield's
// loop (its Tick): the default sampling.max_per_second.
const samplesPerInterval = 20000

// BenchmarkShieldSamplePath is the daemon's CPU for learning from 1-in-N
// samples: for each sample the real program wrote to the real ring buffer
// (BPF_PROG_TEST_RUN, sampling one_in 1, cap 1M/s), the daemon's reader
// takes the record (maps.SampleReader: ring buffer read and decode), hands
// it to the shield (attribution, the queue) and the shield's loop observes
// it (keys, baselines, heavy hitters, fingerprint summaries when hot), with
// one interval's work (shieldRun.tick: aggregate counters, detection, actions)
// per 20,000 samples. Filling the ring buffer is not timed. The peer,
// ring-read, reads and decodes the same records and does nothing else; the
// full path reports its ns/sample as a ratio to it (x-ring-read), and the
// CPU-seconds per second it costs at the default cap (20,000 samples/s)
// and at 1M samples/s (one_in 1 uncapped), i.e. ns/sample x rate.
func BenchmarkShieldSamplePath(b *testing.B) {
	dir := b.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	if err := os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644); err != nil {
		b.Fatal(err)
	}
	d := loadedDaemon(b, Options{StateDir: dir}, shieldTestPolicy(asnPath))
	r, err := d.m.Samples.NewRateReader()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	st := d.shield
	p := &samplePath{d: d, r: r, now: time.Now()}
	// observe is the daemon's path for one record: read (readRing),
	// shieldRun.sample, and the loop's Observe (shieldRun.run).
	observe := func() bool {
		s, err := r.Read()
		if err != nil {
			b.Fatal(err)
		}
		d.samples.read.Add(1)
		d.shield.sample(s)
		select {
		case smp := <-st.in:
			st.mu.Lock()
			eng := st.eng
			st.mu.Unlock()
			eng.Observe(smp)
			return true
		default:
			return false // not attributed (cannot happen here)
		}
	}
	tick := func() {
		p.now = p.now.Add(time.Second)
		d.shield.tick(p.now)
	}
	// Learn the normal mix for 30 intervals (one fill each), so the flood
	// is judged.
	p.frames = samplePathFrames(false)
	tick()
	for range 30 {
		for range p.fill(b, ringBatch) {
			if !observe() {
				b.Fatal("a sample did not reach the shield")
			}
		}
		tick()
	}
	drain := func() { // nothing left over from a run
		r.SetDeadline(time.Now())
		defer r.SetDeadline(time.Time{})
		for {
			if _, err := r.Read(); errors.Is(err, os.ErrDeadlineExceeded) {
				return
			} else if err != nil {
				b.Fatal(err)
			}
		}
	}

	run := func(b *testing.B, each func() bool, ticks bool) float64 {
		drain()
		b.ResetTimer()
		b.StopTimer()
		done, sinceTick := 0, 0
		for done < b.N {
			n := p.fill(b, min(ringBatch, b.N-done))
			b.StartTimer()
			for range n {
				each()
				if sinceTick++; ticks && sinceTick == samplesPerInterval {
					tick()
					sinceTick = 0
				}
			}
			b.StopTimer()
			done += n
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(done)
		b.ReportMetric(ns, "ns/sample")
		return ns
	}
	for _, mix := range []string{"normal", "flood"} {
		p.frames = samplePathFrames(mix == "flood")
		var peer float64
		b.Run(mix+"/ring-read", func(b *testing.B) {
			peer = run(b, func() bool { _, err := r.Read(); return err == nil }, false)
		})
		b.Run(mix+"/full", func(b *testing.B) {
			ns := run(b, observe, true)
			if peer > 0 {
				b.ReportMetric(ns/peer, "x-ring-read")
			}
			b.ReportMetric(ns*samplesPerInterval/1e9, "cpu-s/s@20k")
			b.ReportMetric(ns*1e6/1e9, "cpu-s/s@1M")
		})
	}
}
