package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/edgeguard/edgeguard/internal/l7/rls"
)

// frozenClock never moves: a sliding window of 2/s admits exactly 2
// requests per key, ever, so every answer is predictable.
type frozenClock struct{}

func (frozenClock) Now() int64 { return int64(time.Hour) }

const benchPolicy = `
l7:
  rls:
    listen: 127.0.0.1:0
    rules:
      - name: per-ip
        domain: bench
        descriptor: [remote_address]
        limits:
          - {name: ip-2, rate: 2/s, algorithm: sliding-window}
`

// startRLS serves the policy with Edgeguard's rate-limit service (the
// daemon's Server) on a free loopback port, on a frozen clock.
func startRLS(t *testing.T) (*rls.Server, string) {
	t.Helper()
	cfg, err := decodePolicy([]byte(benchPolicy), "bench.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := rls.NewServer(rls.ServerOptions{Clock: frozenClock{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(s.Close)
	ch, err := s.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	return s, s.Addrs()["grpc"]
}

func dialTest(t *testing.T, target string, framed [][]byte, workers, conns int) []*h2conn {
	t.Helper()
	hcs, err := dialH2s(target, framed, workers, conns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, hc := range hcs {
			hc.Close()
		}
	})
	return hcs
}

// Every answer is read and counted as the server decided it: on a frozen
// clock each of 16 keys is admitted exactly twice, and everything else is
// OVER_LIMIT; two phases on the same connections (warm-up, then measured)
// add up; every counted request has a latency.
func TestLoadCountsServerDecisions(t *testing.T) {
	_, target := startRLS(t)
	const keys = 16
	_, framed, err := requests("bench", keys)
	if err != nil {
		t.Fatal(err)
	}
	hcs := dialTest(t, target, framed, 24, 3) // 8 in flight on each of 3 connections
	_, warm, err := runH2(hcs, 100*time.Millisecond, false)
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	lat, got, err := runH2(hcs, 300*time.Millisecond, true)
	if err != nil {
		t.Fatal(err)
	}
	total := got[0] + got[1] + warm[0] + warm[1]
	t.Logf("warm-up ok %d over %d; measured ok %d over %d errors %d", warm[0], warm[1], got[0], got[1], got[2])
	if warm[2] != 0 || got[2] != 0 {
		t.Fatalf("errors %d and %d, want none", warm[2], got[2])
	}
	if ok := warm[0] + got[0]; ok != 2*keys {
		t.Fatalf("%d OK answers, want exactly %d (2 per key on a frozen clock)", ok, 2*keys)
	}
	if total < 10*keys {
		t.Fatalf("%d answers in 0.4 s: the client barely ran", total)
	}
	if int64(len(lat)) != got[0]+got[1] {
		t.Fatalf("%d latencies for %d answers", len(lat), got[0]+got[1])
	}
	for _, d := range lat {
		if d <= 0 {
			t.Fatalf("latency %v", d)
		}
	}
}

// A gRPC error status (here InvalidArgument for an empty descriptor) is
// counted as an error, never as a decision, and the run reports it.
func TestLoadCountsErrorStatus(t *testing.T) {
	_, target := startRLS(t)
	_, framed, err := requests("bench", 4)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := grpcFrame(&rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}})
	if err != nil {
		t.Fatal(err)
	}
	// All bad: every answer an error.
	hcs := dialTest(t, target, [][]byte{bad}, 8, 2)
	_, got, err := runH2(hcs, 200*time.Millisecond, true)
	t.Logf("all bad: ok %d over %d errors %d: %v", got[0], got[1], got[2], err)
	if err == nil || !strings.Contains(err.Error(), "grpc-status 3") {
		t.Fatalf("run error %v, want the first answer's grpc-status 3", err)
	}
	if got[0]+got[1] != 0 || got[2] == 0 {
		t.Fatalf("ok %d over %d errors %d: want only errors", got[0], got[1], got[2])
	}
	// Mixed: the good keys' answers still count, the bad one's are errors.
	hcs = dialTest(t, target, append(framed, bad), 8, 2)
	_, got, err = runH2(hcs, 200*time.Millisecond, true)
	t.Logf("mixed: ok %d over %d errors %d", got[0], got[1], got[2])
	if err == nil || got[2] == 0 || got[0]+got[1] == 0 {
		t.Fatalf("ok %d over %d errors %d (%v): want decisions and errors", got[0], got[1], got[2], err)
	}
}

// A server that goes away mid-run ends the run with an error, at once.
func TestLoadServerClosedMidRun(t *testing.T) {
	s, target := startRLS(t)
	_, framed, err := requests("bench", 16)
	if err != nil {
		t.Fatal(err)
	}
	hcs := dialTest(t, target, framed, 8, 2)
	time.AfterFunc(150*time.Millisecond, s.Close)
	_, got, err := runWithin(t, hcs, 3*time.Second, 20*time.Second)
	t.Logf("ok %d over %d errors %d: %v", got[0], got[1], got[2], err)
	if err == nil {
		t.Fatal("the server closed and the run reported no error")
	}
}

// A server that stops answering (the connection stays open, nothing comes
// back) ends the run with an error once the in-flight requests have waited
// the drain time after the run's end, not a hang.
func TestLoadServerStopsAnswering(t *testing.T) {
	_, target := startRLS(t)
	_, framed, err := requests("bench", 16)
	if err != nil {
		t.Fatal(err)
	}
	fwd, freeze := forwarder(t, target)
	hcs := dialTest(t, fwd, framed, 8, 2)
	for _, hc := range hcs {
		hc.drain = 300 * time.Millisecond
	}
	time.AfterFunc(150*time.Millisecond, freeze)
	_, got, err := runWithin(t, hcs, 500*time.Millisecond, 20*time.Second)
	t.Logf("ok %d over %d errors %d: %v", got[0], got[1], got[2], err)
	if err == nil || !strings.Contains(err.Error(), "unanswered") {
		t.Fatalf("run error %v, want requests unanswered", err)
	}
}

// runWithin runs a phase of d and fails the test if it has not returned
// within limit (a hang).
func runWithin(t *testing.T, hcs []*h2conn, d, limit time.Duration) ([]time.Duration, [3]int64, error) {
	t.Helper()
	type result struct {
		lat []time.Duration
		got [3]int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		lat, got, err := runH2(hcs, d, true)
		done <- result{lat, got, err}
	}()
	select {
	case r := <-done:
		return r.lat, r.got, r.err
	case <-time.After(limit):
		t.Fatalf("the run did not return within %v", limit)
		return nil, [3]int64{}, nil
	}
}

// forwarder relays TCP connections to target until freeze is called; from
// then on it keeps every connection open and reads what the client sends,
// but passes nothing back: a server that stopped answering.
func forwarder(t *testing.T, target string) (addr string, freeze func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var frozen atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				return
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			relay := func(dst, src net.Conn, gated bool) {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 && !(gated && frozen.Load()) {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
							t.Logf("forwarder: %v", err)
						}
						return
					}
				}
			}
			wg.Add(2)
			go relay(up, c, false)
			go relay(c, up, true)
		}
	}()
	return ln.Addr().String(), func() { frozen.Store(true) }
}

// countingRLS answers every request OK through grpc-go's own server
// transport and records how many calls were in its handler at once.
type countingRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	calls, in, maxIn atomic.Int64
}

func (c *countingRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	c.calls.Add(1)
	n := c.in.Add(1)
	defer c.in.Add(-1)
	for {
		m := c.maxIn.Load()
		if n <= m || c.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(50 * time.Microsecond) // let requests pile up against the limit
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// The client honours a server's SETTINGS_MAX_CONCURRENT_STREAMS (3, below
// its depth of 16: grpc-go refuses a stream over it) and its smallest
// windows (64 KiB for the connection and each stream: the client sends
// past them only on the server's WINDOW_UPDATEs), through grpc-go's server
// transport.
func TestLoadHonoursServerLimits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(3), grpc.InitialConnWindowSize(1<<16), grpc.InitialWindowSize(1<<16))
	svc := &countingRLS{}
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	_, framed, err := requests("bench", 16)
	if err != nil {
		t.Fatal(err)
	}
	hcs := dialTest(t, ln.Addr().String(), framed, 16, 1)
	_, got, err := runWithin(t, hcs, 500*time.Millisecond, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sent := got[0] * int64(len(framed[0]))
	t.Logf("ok %d errors %d; the handler saw %d calls, at most %d at once; %d bytes of messages sent", got[0], got[2], svc.calls.Load(), svc.maxIn.Load(), sent)
	if got[2] != 0 || got[0] != svc.calls.Load() {
		t.Fatalf("ok %d errors %d for %d calls: refused streams or lost answers", got[0], got[2], svc.calls.Load())
	}
	if m := svc.maxIn.Load(); m > 3 {
		t.Fatalf("%d calls at once, over the server's limit of 3 streams", m)
	}
	if sent <= 1<<16 {
		t.Fatalf("only %d bytes sent: the window was never exhausted, the test proves nothing", sent)
	}
}

// appendFrame writes the bytes http2.Framer writes for the requests'
// HEADERS and DATA frames.
func TestAppendFrame(t *testing.T) {
	var want []byte
	fw := http2.NewFramer((*appendWriter)(&want), nil)
	block := []byte("header block")
	msg := []byte{0, 0, 0, 0, 3, 1, 2, 3}
	for _, id := range []uint32{1, 3, 1<<31 - 1} {
		if err := fw.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fw.WriteData(id, true, msg); err != nil {
			t.Fatal(err)
		}
	}
	var got []byte
	for _, id := range []uint32{1, 3, 1<<31 - 1} {
		got = appendFrame(got, http2.FrameHeaders, http2.FlagHeadersEndHeaders, id, block)
		got = appendFrame(got, http2.FrameData, http2.FlagDataEndStream, id, msg)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendFrame\n% x\nhttp2.Framer\n% x", got, want)
	}
}
