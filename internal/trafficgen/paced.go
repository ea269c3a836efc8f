package trafficgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Per-frame deadlines (Flood.Deadlines): every frame leaves at its own
// scheduled time, from a thread of its own that runs SCHED_FIFO, so that
// neither Go's timers nor the other tasks of a loaded machine decide when:
// a normal (CFS) thread that sleeps to a 100 µs step wakes up hundreds of
// µs late under load, and the frames due meanwhile leave back to back. A
// real-time thread that sleeps with clock_nanosleep(TIMER_ABSTIME) to each
// frame's time is woken by its hrtimer with no timer slack and preempts
// every normal task at once. The veth's receive side (the XDP program)
// runs in the softirq that the send raises, on the sender's CPU right
// after the send: the data plane sees each frame at its time too.
//
// A fq qdisc with SO_TXTIME would let the kernel release frames without a
// real-time thread, but it is not in every kernel (not in the testbed's),
// so the sender keeps its own time.
const (
	// deadlineLate: a frame whose time passed by more than this when the
	// sender reaches it (the VM descheduled, an interrupt storm) is not
	// sent (FloodResult.Late): sent late, it would leave back to back with
	// the next ones, the timing this mode avoids. Frames late by less are
	// sent at once: skipping them all would cost a loaded machine up to a
	// quarter of the flood.
	deadlineLate = time.Millisecond
	// deadlinePriority is the sender's SCHED_FIFO priority: the lowest,
	// above every normal task and below the kernel's own real-time
	// threads. The kernel's real-time throttling
	// (sched_rt_runtime_us) still leaves normal tasks 5% of each CPU.
	deadlinePriority = 1
	// deadlineEarly: a frame due sooner than this is sent at once rather
	// than slept for (so frames leave up to this early, never clumped
	// coarser than this).
	deadlineEarly = 10 * time.Microsecond
)

// runDeadlines is Run with Deadlines: frame n is sent at its scheduled
// time (evenly spaced at Rate, or Poisson gaps); send builds frame n. It
// runs on a locked OS thread of its own, set to SCHED_FIFO, which never
// returns to the Go scheduler's pool (it exits with its goroutine), so no
// other goroutine ever runs real-time.
func (f Flood) runDeadlines(ctx context.Context, c *PacketConn, send func(n uint64) []byte) (FloodResult, error) {
	type out struct {
		res FloodResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		attr := unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: deadlinePriority}
		if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
			done <- out{err: fmt.Errorf("flood: SCHED_FIFO for the per-frame deadlines (needs root or CAP_SYS_NICE): %w", err)}
			return
		}
		res := f.deadlineLoop(ctx, c, send)
		done <- out{res: res}
	}()
	o := <-done
	return o.res, o.err
}

// deadlinePrebuild bounds the bytes of the frames built before the flood
// starts: building them in the timed loop allocates, and the garbage
// collector's assists then delay the sender.
const deadlinePrebuild = 64 << 20

// prebuild builds, in order, the frames a flood sends within its Duration
// (Poisson: 10% more, the rest is built as it goes), if they fit in
// deadlinePrebuild.
func (f Flood) prebuild(send func(n uint64) []byte) [][]byte {
	want := min(uint64(f.Count), uint64(float64(f.Rate)*f.Duration.Seconds()*1.1)+100)
	first := send(0)
	if want*uint64(len(first)) > deadlinePrebuild {
		return [][]byte{first}
	}
	out := make([][]byte, 1, want)
	out[0] = first
	for n := uint64(1); n < want; n++ {
		out = append(out, send(n))
	}
	return out
}

func (f Flood) deadlineLoop(ctx context.Context, c *PacketConn, send func(n uint64) []byte) FloodResult {
	var res FloodResult
	built := f.prebuild(send)
	frameOf := func(n uint64) []byte {
		if n < uint64(len(built)) {
			return built[n]
		}
		return send(n)
	}
	gaps := rand.New(rand.NewPCG(f.Seed^0x5851f42d4c957f2d, f.Seed))
	mean := float64(time.Second) / float64(f.Rate)
	gap := func() float64 {
		if f.Poisson {
			return gaps.ExpFloat64() * mean
		}
		return mean
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for CLOCK_MONOTONIC
	mono0, start := ts.Nano(), time.Now()
	at := 0.0 // ns after start: frame n's time
	if f.Poisson {
		at = gap()
	}
	for n := uint64(0); n < uint64(f.Count) && at < float64(f.Duration); n++ {
		if n%256 == 0 && ctx.Err() != nil {
			break
		}
		frame := frameOf(n)
		// A frame due within deadlineEarly leaves now: a sleep and its
		// wake-up cost about as much on a VM, and falling behind would
		// cost frames.
		if wait := time.Duration(at) - time.Since(start); wait > deadlineEarly {
			t := unix.NsecToTimespec(mono0 + int64(at))
			for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &t, nil) == unix.EINTR {
			}
		}
		if time.Since(start) > time.Duration(at)+deadlineLate {
			res.Late++
		} else if err := c.Write(frame); err != nil {
			res.Errors++
		} else {
			res.Sent++
			if f.Progress != nil {
				f.Progress.Add(1)
			}
		}
		at += gap()
	}
	res.Elapsed = time.Since(start)
	return res
}
