package trafficgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Hard bounds on legitimate traffic.
const (
	MaxLegitRequests = 1_000_000
	MaxLegitDuration = 10 * time.Minute
)

// legitMagic starts every legit request and reply: 8 magic bytes, then
// the sequence number.
var legitMagic = []byte("eg-legit")

// LegitSize is the payload of a legitimate request (and its reply), in
// bytes: a flood that wants to look like the users sends the same.
const LegitSize = 16

// LegitUDP sends requests from real UDP sockets (one per client address,
// connected to an echo server) and waits for each reply.
type LegitUDP struct {
	// Conns are connected UDP sockets, opened in the clients' namespaces
	// from their own addresses.
	Conns []*net.UDPConn
	// Rate is requests per second per socket; Count (per socket) and
	// Duration bound the run.
	Rate     int
	Count    int
	Duration time.Duration
	// Timeout is how long a reply may take; later ones count as lost.
	// Default 1 s.
	Timeout time.Duration
	// Progress, if set, counts requests and replies as they happen.
	Progress *LegitProgress
	// Burst > 1 makes the traffic bursty, the way a person's is (a page
	// and its assets, then reading): requests leave in bursts of Burst
	// back to back, and the gaps between bursts are drawn from an
	// exponential distribution whose mean keeps the average at Rate per
	// socket. So one second may carry several times Rate and the next
	// nothing. Seed draws the gaps; each socket has its own stream, and
	// its first burst comes at a random offset so sockets do not align.
	Burst int
	Seed  uint64
}

// LegitProgress counts requests and replies while a run goes on.
type LegitProgress struct {
	Sent, Replied atomic.Uint64
}

// LegitResult is what the legitimate clients saw.
type LegitResult struct {
	Sent, Replied int
	Latencies     []time.Duration // one per reply, sorted
	// Opening and OpeningReplied count the requests that open a burst
	// (bursty traffic only; the first of a page's requests).
	Opening, OpeningReplied int
}

// Success is the fraction of requests that got a reply (1 with none sent).
func (r LegitResult) Success() float64 {
	if r.Sent == 0 {
		return 1
	}
	return float64(r.Replied) / float64(r.Sent)
}

// Quantile of the reply latencies (0 with none).
func (r LegitResult) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[min(int(q*float64(len(r.Latencies))), len(r.Latencies)-1)]
}

// Add merges two results.
func (r LegitResult) Add(o LegitResult) LegitResult {
	out := LegitResult{Sent: r.Sent + o.Sent, Replied: r.Replied + o.Replied,
		Opening: r.Opening + o.Opening, OpeningReplied: r.OpeningReplied + o.OpeningReplied}
	out.Latencies = append(append(out.Latencies, r.Latencies...), o.Latencies...)
	slices.Sort(out.Latencies)
	return out
}

func (r LegitResult) String() string {
	return fmt.Sprintf("%d/%d replied (%.2f%%), p50 %v, p99 %v", r.Replied, r.Sent, 100*r.Success(),
		r.Quantile(0.5).Round(time.Microsecond), r.Quantile(0.99).Round(time.Microsecond))
}

func checkLegitBounds(rate, count int, d time.Duration) error {
	switch {
	case rate < 1 || rate > 100_000:
		return fmt.Errorf("legit rate %d/s: want 1 to 100000", rate)
	case count < 1 || count > MaxLegitRequests:
		return fmt.Errorf("legit count %d: want 1 to %d", count, MaxLegitRequests)
	case d <= 0 || d > MaxLegitDuration:
		return fmt.Errorf("legit duration %v: want more than 0 and at most %v", d, MaxLegitDuration)
	}
	return nil
}

// Run sends from every socket at once until each sent Count requests or
// Duration passed, then waits up to Timeout for the last replies.
func (g LegitUDP) Run(ctx context.Context) (LegitResult, error) {
	if err := checkLegitBounds(g.Rate, g.Count, g.Duration); err != nil {
		return LegitResult{}, err
	}
	if g.Burst < 0 || g.Burst > 1000 {
		return LegitResult{}, fmt.Errorf("legit burst %d: want 0 to 1000", g.Burst)
	}
	timeout := g.Timeout
	if timeout == 0 {
		timeout = time.Second
	}
	results := make([]LegitResult, len(g.Conns))
	errs := make([]error, len(g.Conns))
	var wg sync.WaitGroup
	for i, c := range g.Conns {
		wg.Go(func() { results[i], errs[i] = g.runOne(ctx, c, timeout, uint64(i)) })
	}
	wg.Wait()
	var total LegitResult
	for _, r := range results {
		total = total.Add(r)
	}
	return total, errors.Join(errs...)
}

func (g LegitUDP) runOne(ctx context.Context, c *net.UDPConn, timeout time.Duration, stream uint64) (LegitResult, error) {
	var mu sync.Mutex
	sentAt := map[uint64]time.Time{}
	var res LegitResult
	readDone := make(chan error, 1)
	stopRead := make(chan struct{})
	go func() {
		buf := make([]byte, 2048)
		for {
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := c.Read(buf)
			now := time.Now()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					select {
					case <-stopRead:
						readDone <- nil
						return
					default:
						continue
					}
				}
				// ICMP errors surface as ECONNREFUSED on a connected
				// socket: a lost request, not a failed run.
				if errors.Is(err, net.ErrClosed) {
					readDone <- err
					return
				}
				continue
			}
			if n != LegitSize || !bytes.HasPrefix(buf[:n], legitMagic) {
				continue
			}
			seq := binary.BigEndian.Uint64(buf[8:])
			mu.Lock()
			if t, ok := sentAt[seq]; ok {
				delete(sentAt, seq)
				if now.Sub(t) <= timeout {
					res.Replied++
					if g.Burst > 1 && seq%uint64(g.Burst) == 0 {
						res.OpeningReplied++
					}
					res.Latencies = append(res.Latencies, now.Sub(t))
					if g.Progress != nil {
						g.Progress.Replied.Add(1)
					}
				}
			}
			mu.Unlock()
		}
	}()
	msg := make([]byte, LegitSize)
	copy(msg, legitMagic)
	schedule := paced
	if g.Burst > 1 {
		rng := rand.New(rand.NewPCG(g.Seed, stream))
		schedule = func(ctx context.Context, rate, count int, d time.Duration, send func(int)) {
			bursty(ctx, rate, g.Burst, count, d, rng, send)
		}
	}
	schedule(ctx, g.Rate, g.Count, g.Duration, func(i int) {
		seq := uint64(i)
		binary.BigEndian.PutUint64(msg[8:], seq)
		mu.Lock()
		sentAt[seq] = time.Now()
		res.Sent++
		if g.Burst > 1 && i%g.Burst == 0 {
			res.Opening++
		}
		mu.Unlock()
		if g.Progress != nil {
			g.Progress.Sent.Add(1)
		}
		c.Write(msg) // a send error is a lost request
	})
	// Replies still on their way: wait for them, bounded by timeout.
	waitUntil := time.Now().Add(timeout)
	for time.Now().Before(waitUntil) {
		mu.Lock()
		left := len(sentAt)
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stopRead)
	err := <-readDone
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(res.Latencies)
	if err != nil {
		return res, fmt.Errorf("legit udp from %s: %w", c.LocalAddr(), err)
	}
	return res, nil
}

// LegitTCP opens one TCP connection per request (handshake, 16-byte
// request, 16-byte reply, close), the way a short-lived client would.
type LegitTCP struct {
	// Dial connects from a client's own address (in its namespace).
	Dial []func(timeout time.Duration) (net.Conn, error)
	// Rate is requests per second per dialer; Count (per dialer) and
	// Duration bound the run.
	Rate     int
	Count    int
	Duration time.Duration
	Timeout  time.Duration // per request, default 1 s
}

// Run runs every dialer at once. Requests of one dialer are sequential:
// a request that takes longer than the interval delays the next.
func (g LegitTCP) Run(ctx context.Context) (LegitResult, error) {
	if err := checkLegitBounds(g.Rate, g.Count, g.Duration); err != nil {
		return LegitResult{}, err
	}
	timeout := g.Timeout
	if timeout == 0 {
		timeout = time.Second
	}
	results := make([]LegitResult, len(g.Dial))
	var wg sync.WaitGroup
	for i, dial := range g.Dial {
		wg.Go(func() {
			res := &results[i]
			paced(ctx, g.Rate, g.Count, g.Duration, func(seq int) {
				res.Sent++
				t0 := time.Now()
				if tcpRequest(dial, uint64(seq), timeout) == nil {
					res.Replied++
					res.Latencies = append(res.Latencies, time.Since(t0))
				}
			})
			slices.Sort(res.Latencies)
		})
	}
	wg.Wait()
	var total LegitResult
	for _, r := range results {
		total = total.Add(r)
	}
	return total, nil
}

func tcpRequest(dial func(time.Duration) (net.Conn, error), seq uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c, err := dial(timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	msg := make([]byte, LegitSize)
	copy(msg, legitMagic)
	binary.BigEndian.PutUint64(msg[8:], seq)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, LegitSize)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("reply does not echo the request")
	}
	return nil
}

// Echo answers legit requests: every datagram on its UDP sockets and every
// TCP connection's bytes go back to the sender. Other datagrams (floods
// aimed at the same port) are counted and not answered.
type Echo struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	closers []io.Closer
	counts  []*countedConn
}

type countedConn struct {
	mu    sync.Mutex
	legit uint64
	other uint64
}

// NewEcho serves udp and tcp until Close. The sockets are opened by the
// caller, inside the edge namespace.
func NewEcho(udp []*net.UDPConn, tcp []*net.TCPListener) *Echo {
	e := &Echo{}
	for _, c := range udp {
		cc := &countedConn{}
		e.counts = append(e.counts, cc)
		e.closers = append(e.closers, c)
		e.wg.Go(func() { serveUDP(c, cc) })
	}
	for _, l := range tcp {
		e.closers = append(e.closers, l)
		e.wg.Go(func() { e.serveTCP(l) })
	}
	return e
}

func serveUDP(c *net.UDPConn, cc *countedConn) {
	buf := make([]byte, 64*1024)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		if n == LegitSize && bytes.HasPrefix(buf[:n], legitMagic) {
			c.WriteToUDPAddrPort(buf[:n], from)
			cc.mu.Lock()
			cc.legit++
			cc.mu.Unlock()
			continue
		}
		cc.mu.Lock()
		cc.other++
		cc.mu.Unlock()
	}
}

func (e *Echo) serveTCP(l *net.TCPListener) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		e.wg.Go(func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.CopyN(c, c, LegitSize)
		})
	}
}

// Other is how many non-legit datagrams the UDP sockets received (a flood
// aimed at the echo port: what passed the edge's limiter).
func (e *Echo) Other() uint64 {
	var n uint64
	for _, cc := range e.counts {
		cc.mu.Lock()
		n += cc.other
		cc.mu.Unlock()
	}
	return n
}

// Close stops serving and waits for the server's goroutines.
func (e *Echo) Close() error {
	var errs []error
	for _, c := range e.closers {
		errs = append(errs, c.Close())
	}
	e.wg.Wait()
	return errors.Join(errs...)
}

// paced calls send(seq) at rate per second from now, at most count times
// and never at or after duration from now, until ctx ends. A send that
// takes longer than the interval delays the next ones.
func paced(ctx context.Context, rate, count int, duration time.Duration, send func(seq int)) {
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for seq := 0; seq < count; seq++ {
		next := start.Add(time.Duration(seq) * interval)
		if !next.Before(start.Add(duration)) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		send(seq)
	}
}

// bursty calls send(seq) in bursts of burst calls back to back, the bursts
// at exponentially distributed gaps of mean burst/rate seconds (the first
// one after such a gap too), at most count times and never at or after
// duration from now, until ctx ends.
func bursty(ctx context.Context, rate, burst, count int, duration time.Duration, rng *rand.Rand, send func(seq int)) {
	start := time.Now()
	end := start.Add(duration)
	mean := float64(time.Duration(burst) * time.Second / time.Duration(rate))
	next := start.Add(time.Duration(rng.ExpFloat64() * mean))
	for seq := 0; seq < count; {
		if !next.Before(end) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		for k := 0; k < burst && seq < count; k++ {
			send(seq)
			seq++
		}
		next = next.Add(time.Duration(rng.ExpFloat64() * mean))
	}
}
