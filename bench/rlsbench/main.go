// Command rlsbench measures rate-limit services over Envoy's RLS v3 gRPC
// protocol with Envoy's generated client (bench/rls.sh runs it):
//
//	rlsbench serve -policy FILE      # Edgeguard's rate-limit service (internal/l7/rls, as the daemon runs it)
//	rlsbench load -target ADDR ...   # decisions/s and latency percentiles against any RLS
//
// Descriptors are [remote_address=198.18.X.Y] over -keys distinct
// addresses, asked in a fixed pseudo-random order by every worker.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rlsbench serve -policy FILE | rlsbench load -target HOST:PORT [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "load":
		err = load(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	path := fs.String("policy", "", "policy file with an l7: rls: section")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the serving to this file")
	_ = fs.Parse(args)
	stop, err := profile(*prof)
	if err != nil {
		return err
	}
	defer stop()
	raw, err := os.ReadFile(*path)
	if err != nil {
		return err
	}
	rc, err := decodePolicy(raw, *path)
	if err != nil {
		return err
	}
	s := rls.NewServer(rls.ServerOptions{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ch, err := s.Prepare(rc)
	if err != nil {
		return err
	}
	ch.Commit()
	fmt.Println("serving", s.Addrs())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Close()
	return nil
}

// decodePolicy is a policy file's rate-limit service configuration, as the
// daemon decodes it.
func decodePolicy(raw []byte, path string) (*rls.Config, error) {
	var doc struct {
		L7 yaml.Node `yaml:"l7"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	pc, probs := proxy.Decode(&doc.L7, path)
	if len(probs) > 0 {
		return nil, fmt.Errorf("%v", probs)
	}
	rc, probs := rls.Decode(pc, path)
	if len(probs) > 0 {
		return nil, fmt.Errorf("%v", probs)
	}
	return rc, nil
}

func load(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:8081", "RLS gRPC address")
	domain := fs.String("domain", "bench", "domain")
	conns := fs.Int("conns", 4, "gRPC connections")
	workers := fs.Int("workers", 64, "requests in flight over all connections (h2: -workers ÷ -conns per connection, refilled in batches by one writer each; grpc: one goroutine each)")
	keys := fs.Int("keys", 4096, "distinct remote_address values")
	dur := fs.Duration("duration", 10*time.Second, "how long")
	warm := fs.Duration("warmup", time.Second, "warm-up before measuring")
	label := fs.String("label", "", "name printed with the result")
	client := fs.String("client", "h2", "h2: pre-encoded requests on multiplexed HTTP/2 connections, every response decoded (h2client.go); grpc: grpc-go's generated client")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the load client to this file")
	pidList := fs.String("cpu-pids", "", "comma-separated pids whose CPU time (utime+stime) is charged to the decisions measured (the service, its redis-server)")
	_ = fs.Parse(args)
	stop, err := profile(*prof)
	if err != nil {
		return err
	}
	defer stop()
	var pids []string
	if *pidList != "" {
		pids = strings.Split(*pidList, ",")
	}

	reqs, framed, err := requests(*domain, *keys)
	if err != nil {
		return err
	}
	// run is one phase of d: the latencies (if record), the counts ok,
	// over_limit and errors, and the first error.
	var run func(d time.Duration, record bool) ([]time.Duration, [3]int64, error)
	switch *client {
	case "grpc":
		var asks []func(i int) (*rlsv3.RateLimitResponse, error)
		for range *conns {
			cc, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer cc.Close()
			c := rlsv3.NewRateLimitServiceClient(cc)
			asks = append(asks, func(i int) (*rlsv3.RateLimitResponse, error) {
				return c.ShouldRateLimit(context.Background(), reqs[i])
			})
		}
		run = func(d time.Duration, record bool) ([]time.Duration, [3]int64, error) {
			return runWorkers(asks, *workers, len(reqs), d, record)
		}
	case "h2":
		// One P: the client's goroutines (one per connection) block in
		// read most of the time, and with more Ps the runtime spins and
		// wakes threads between them (measured: ~0.5 µs less CPU per
		// request on 2 cores with one). GOMAXPROCS in the environment wins.
		if os.Getenv("GOMAXPROCS") == "" {
			runtime.GOMAXPROCS(1)
		}
		hcs, err := dialH2s(*target, framed, *workers, *conns)
		if err != nil {
			return err
		}
		for _, hc := range hcs {
			defer hc.Close()
		}
		run = func(d time.Duration, record bool) ([]time.Duration, [3]int64, error) {
			return runH2(hcs, d, record)
		}
	default:
		return fmt.Errorf("-client %q: want h2 or grpc", *client)
	}
	// warm-up: connections, scripts, first keys
	if _, _, err := run(*warm, false); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	cpu0, cerr := cpuTicks(pids)
	if cerr != nil {
		return cerr
	}
	self0, cerr := cpuTicks([]string{"self"})
	if cerr != nil {
		return cerr
	}
	t0 := time.Now()
	all, total, err := run(*dur, true)
	elapsed := time.Since(t0)
	cpu1, _ := cpuTicks(pids)
	self1, _ := cpuTicks([]string{"self"})
	if err != nil && total[2] == 0 {
		return err
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(float64(len(all))*p))]
	}
	n := total[0] + total[1]
	cpu := ""
	if len(pids) > 0 && n > 0 {
		// USER_HZ is 100 on Linux: a tick is 10ms.
		cpu = fmt.Sprintf("  cpu/decision %6.1fus", float64(cpu1-cpu0)*1e4/float64(n))
	}
	if n+total[2] > 0 {
		cpu += fmt.Sprintf("  client-cpu/request %5.1fus", float64(self1-self0)*1e4/float64(n+total[2]))
	}
	fmt.Printf("%-28s decisions/s %9.0f  p50 %8s  p99 %8s%s  ok %d over_limit %d errors %d\n", *label,
		float64(n)/elapsed.Seconds(), pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), cpu, total[0], total[1], total[2])
	if err != nil {
		return fmt.Errorf("%d requests failed, the first: %w", total[2], err)
	}
	return nil
}

// requests are the load's requests: [remote_address=198.18.X.Y] over keys
// distinct addresses, as Envoy's types and pre-encoded in gRPC's envelope.
func requests(domain string, keys int) ([]*rlsv3.RateLimitRequest, [][]byte, error) {
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	framed := make([][]byte, keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprintf("198.18.%d.%d", i/256%256, i%256)}}}}}
		var err error
		if framed[i], err = grpcFrame(reqs[i]); err != nil {
			return nil, nil, err
		}
	}
	return reqs, framed, nil
}

// dialH2s opens conns h2 connections to target that keep workers requests
// in flight between them.
func dialH2s(target string, framed [][]byte, workers, conns int) ([]*h2conn, error) {
	if conns < 1 || workers < conns {
		return nil, fmt.Errorf("-workers %d on -conns %d: want at least one request in flight per connection", workers, conns)
	}
	var hcs []*h2conn
	for i := range conns {
		depth := workers / conns
		if i < workers%conns {
			depth++
		}
		hc, err := dialH2(target, framed, depth)
		if err != nil {
			for _, hc := range hcs {
				hc.Close()
			}
			return nil, err
		}
		hcs = append(hcs, hc)
	}
	return hcs, nil
}

// runWorkers is one phase of grpc-go's client: workers goroutines, each one
// request at a time on connection w % len(asks); a worker stops at its
// first error.
func runWorkers(asks []func(i int) (*rlsv3.RateLimitResponse, error), workers, keys int, d time.Duration, record bool) ([]time.Duration, [3]int64, error) {
	var wg sync.WaitGroup
	lat := make([][]time.Duration, workers)
	counts := make([][3]int64, workers)
	errs := make(chan error, workers)
	end := time.Now().Add(d)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ask := asks[w%len(asks)]
			rng := rand.New(rand.NewPCG(uint64(w), 26))
			for time.Now().Before(end) {
				t0 := time.Now()
				res, err := ask(rng.IntN(keys))
				el := time.Since(t0)
				if err != nil {
					errs <- err
					counts[w][2]++
					return
				}
				if record {
					lat[w] = append(lat[w], el)
				}
				if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					counts[w][0]++
				} else {
					counts[w][1]++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return slices.Concat(lat...), sumCounts(counts), <-errs
}

// runH2 is one phase on the h2 connections, each driven by one goroutine
// (its writer) with its own key order. A connection that fails ends the
// phase with its error; failed requests are counted and the first one's
// error returned.
func runH2(hcs []*h2conn, d time.Duration, record bool) ([]time.Duration, [3]int64, error) {
	end := time.Now().Add(d)
	sts := make([]phaseStats, len(hcs))
	errs := make([]error, len(hcs))
	var wg sync.WaitGroup
	for i, hc := range hcs {
		sts[i].record = record
		if record {
			sts[i].lat = make([]time.Duration, 0, 1<<18)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = hc.run(end, &sts[i], rand.New(rand.NewPCG(uint64(i), 26)))
		}()
	}
	wg.Wait()
	var lat [][]time.Duration
	counts := make([][3]int64, len(hcs))
	var first error
	for i, st := range sts {
		lat = append(lat, st.lat)
		counts[i] = [3]int64{st.ok, st.over, st.errors}
		first = cmp.Or(first, errs[i], st.firstErr)
	}
	return slices.Concat(lat...), sumCounts(counts), first
}

func sumCounts(counts [][3]int64) [3]int64 {
	var total [3]int64
	for _, c := range counts {
		for i := range total {
			total[i] += c[i]
		}
	}
	return total
}

// profile starts a CPU profile into path (none if path is empty); stop
// ends it.
func profile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// cpuTicks is the summed utime+stime of pids, in clock ticks.
func cpuTicks(pids []string) (int64, error) {
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return 0, fmt.Errorf("cpu of pid %s: %w", pid, err)
		}
		// Fields after the command (which may hold spaces) start after ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 13 {
			return 0, fmt.Errorf("cpu of pid %s: short stat", pid)
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		sum += u + st
	}
	return sum, nil
}
