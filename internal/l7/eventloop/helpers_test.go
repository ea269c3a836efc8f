package eventloop_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
)

// ioTimeout bounds every read and write of a test: generous, since the
// tests run on a noisy 2-core machine under -race.
const ioTimeout = 15 * time.Second

// engine is a running Server: its address, the cancel that starts its
// shutdown, and Serve's result once it returned.
type engine struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// wait returns Serve's error, failing the test if Serve has not returned
// within limit.
func (e *engine) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-e.done:
		return err
	case <-time.After(limit):
		t.Fatalf("Serve did not return within %v", limit)
		return nil
	}
}

// runEngine serves cfg on a fresh loopback listener; the test controls the
// shutdown. A cleanup cancels and waits for Serve in any case.
func runEngine(t *testing.T, cfg eventloop.Config) *engine {
	t.Helper()
	srv, err := eventloop.New(cfg)
	if err != nil {
		t.Fatalf("eventloop.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return serveEngine(t, srv, ln)
}

// serveEngine serves srv on ln; the test controls the shutdown. A cleanup
// cancels and waits for Serve in any case.
func serveEngine(t *testing.T, srv *eventloop.Server, ln net.Listener) *engine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &engine{addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		e.done <- srv.Serve(ctx, ln)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			t.Errorf("Serve did not return within 30s of its context's end")
		}
	})
	return e
}

// expectCleanEnd checks, when the test ends, that Serve returns nil once
// its context is cancelled.
func (e *engine) expectCleanEnd(t *testing.T) {
	t.Cleanup(func() {
		e.cancel()
		select {
		case err := <-e.done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Serve did not return within 30s of its context's end")
		}
	})
}

// startEngine serves cfg until the test ends, and checks that Serve then
// returns nil.
func startEngine(t *testing.T, cfg eventloop.Config) (addr string) {
	t.Helper()
	e := runEngine(t, cfg)
	e.expectCleanEnd(t)
	return e.addr
}

// forwardAll is a handler that has every request proxied.
func forwardAll(*testing.T) eventloop.Handler {
	return serveWith(nil, func(_ http.ResponseWriter, _ *http.Request, forward func()) { forward() })
}

// testHandler is a test's handler, run on the loop or off it (serveWith):
// it answers on w, or calls forward to have the request proxied (off the
// loop, forward returns once the response has been relayed).
type testHandler func(w http.ResponseWriter, r *http.Request, forward func())

// serveWith makes h the engine's Handler: the requests offLoop picks
// (nil: none) are decided on a goroutine (Continue), as a handler that
// may block would have them; the others on the loop.
func serveWith(offLoop func(*http.Request) bool, h testHandler) eventloop.Handler {
	return &testServe{offLoop: offLoop, h: h}
}

type testServe struct {
	offLoop func(*http.Request) bool
	h       testHandler
}

func (s *testServe) Decide(w http.ResponseWriter, r *http.Request) eventloop.Decision {
	if s.offLoop != nil && s.offLoop(r) {
		return eventloop.Continue(func(w http.ResponseWriter, r *http.Request, relay *eventloop.Relay) {
			s.h(w, r, relay.Forward)
		})
	}
	forward := false
	s.h(w, r, func() { forward = true })
	if forward {
		return eventloop.Forward()
	}
	return eventloop.Respond()
}

// proxyConfig is a Config forwarding everything to upstream, with short
// timeouts that no test waits on unless it means to.
func proxyConfig(t *testing.T, upstream string) eventloop.Config {
	return eventloop.Config{
		Upstream:        mustURL(t, upstream),
		Handler:         forwardAll(t),
		ShutdownTimeout: 10 * time.Second,
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}

// httpUpstream is a net/http upstream; it counts the connections it
// accepted.
type httpUpstream struct {
	*httptest.Server
	accepted atomic.Int64
}

func startHTTPUpstream(t *testing.T, h http.Handler) *httpUpstream {
	t.Helper()
	u := &httpUpstream{Server: httptest.NewUnstartedServer(h)}
	u.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.accepted.Add(1)
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

// rawUpstream is a TCP upstream that hands each accepted connection to a
// function, for byte-level control of what the engine reads.
type rawUpstream struct {
	addr     string
	accepted atomic.Int64
}

func startRawUpstream(t *testing.T, serve func(c net.Conn)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	u := &rawUpstream{addr: ln.Addr().String()}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			_ = c.SetDeadline(time.Now().Add(2 * ioTimeout))
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return u
}

func (u *rawUpstream) url() string { return "http://" + u.addr }

// readHead reads a message head (up to its blank line) from br.
func readHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\r\n" || line == "\n" {
			return b.String(), nil
		}
	}
}

// dial opens a raw client connection to the engine, closed when the test
// ends; every read and write is bounded.
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// response is a response read whole from a raw connection.
type response struct {
	*http.Response
	body []byte
}

// readResponse reads one response to a request with the given method, body
// included.
func readResponse(t *testing.T, br *bufio.Reader, method string) response {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read response body: %v", err)
	}
	return response{Response: resp, body: body}
}

// expectClosed checks that the engine closes c without sending anything
// more (a reset counts as closed).
func expectClosed(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	expectClosedWithin(t, c, br, ioTimeout)
}

// expectAnswerThenClose checks that the engine answers status, then
// closes c.
func expectAnswerThenClose(t *testing.T, c net.Conn, br *bufio.Reader, status int) {
	t.Helper()
	if resp := readResponse(t, br, http.MethodPost); resp.StatusCode != status {
		t.Fatalf("status %d, want %d", resp.StatusCode, status)
	}
	expectClosed(t, c, br)
}

// expectClosedWithin is expectClosed with a bound on the wait.
func expectClosedWithin(t *testing.T, c net.Conn, br *bufio.Reader, limit time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	b, err := br.ReadByte()
	switch {
	case err == nil:
		rest, _ := br.Peek(br.Buffered())
		t.Fatalf("connection still open: read %q", append([]byte{b}, rest...))
	case errors.Is(err, io.EOF), isReset(err):
	default:
		t.Fatalf("connection not closed: %v", err)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// client is an http.Client for the engine; its idle connections are closed
// when the test ends.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: ioTimeout}
}

// get fetches path from the engine and returns the response with its body.
func get(t *testing.T, c *http.Client, addr, path string) response {
	t.Helper()
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", path, err)
	}
	return response{Response: resp, body: body}
}

// pattern returns n bytes that differ from one offset to the next, so a
// lost, doubled or reordered piece shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i/251) + seed
	}
	return b
}

// slowReader reads r in small pieces with pauses, so that the engine's
// queue towards it fills (back-pressure) before it drains.
type slowReader struct {
	r     io.Reader
	reads int
}

func (s *slowReader) Read(p []byte) (int, error) {
	s.reads++
	if s.reads%64 == 1 {
		time.Sleep(20 * time.Millisecond)
	}
	return s.r.Read(p[:min(len(p), 4096)])
}

func firstDiff(a, b []byte) string {
	if bytes.Equal(a, b) {
		return "equal"
	}
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return fmt.Sprintf("lengths %d and %d, first difference at %d", len(a), len(b), i)
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(a), len(b))
}

// onGoroutine is h (made by serveWith) with the requests cond picks
// decided on a goroutine.
func onGoroutine(cond func(*http.Request) bool, h eventloop.Handler) eventloop.Handler {
	s := *h.(*testServe)
	s.offLoop = cond
	return &s
}
