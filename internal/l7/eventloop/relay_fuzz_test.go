package eventloop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FuzzRelay drives the relay (conn.go) end to end: the fuzzer's bytes go to
// a running engine as a client's, and the upstream answers every request it
// reads with the fuzzer's response bytes. Whatever the input:
//   - every message the engine sends the upstream is one net/http's server
//     reads as a request, whole (an unfinished one only when the engine
//     gave up on the client's): the relay never forwards bytes a server
//     would frame differently;
//   - everything the client gets reads as responses, one after another (the
//     last may be cut off);
//   - the engine neither panics nor hangs, and shuts down cleanly.
func FuzzRelay(f *testing.F) {
	seeds := [][2]string{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{"POST /x HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: 36\r\n\r\nGET /limited/S HTTP/1.1\r\nHost: a\r\n\r\n",
			"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 2\r\n\r\nok"},
		{"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
			"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"},
		{"GET /a HTTP/1.0\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"},
		{"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG", "HTTP/1.1 200 OK\r\n\r\nclose-delimited"},
		{"GET /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
			"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		{"GET /u HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nraw"},
		{"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\nGET /g HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"},
		{"GET http://a<b/x HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	up := startFuzzUpstream(f)
	srv, err := New(Config{
		Upstream:          &url.URL{Scheme: "http", Host: up.ln.Addr().String()},
		Handler:           fuzzHandler{},
		Loops:             1,
		ReadHeaderTimeout: time.Second,
		BodyReadTimeout:   time.Second,
		ShutdownTimeout:   5 * time.Second,
	})
	if err != nil {
		f.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	f.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				f.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			f.Errorf("Serve did not return")
		}
	})
	addr := ln.Addr().String()

	f.Fuzz(func(t *testing.T, client, response []byte) {
		if len(client) > 1<<16 || len(response) > 1<<16 {
			return
		}
		up.response.Store(&response)
		watchdog := time.AfterFunc(20*time.Second, func() {
			panic(fmt.Sprintf("relay fuzz: an input took over 20s: client %q, response %q", client, response))
		})
		defer watchdog.Stop()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		go func() { _, _ = c.Write(client) }()
		// Read until the engine closes or goes quiet for a while.
		var got []byte
		buf := make([]byte, 32<<10)
		for {
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		checkResponses(t, got, client)
		if err := up.violation(); err != nil {
			t.Fatalf("client %q, upstream response %q: %v", client, response, err)
		}
	})
}

// clientMethods lists the methods of the requests at the start of client,
// as the engine's parser reads them, for reading the answers to HEAD.
func clientMethods(client []byte) []string {
	var out []string
	var h requestHead
	for len(client) > 0 {
		n, err := parseRequestHead(client, &h, maxHead)
		if err != nil || n == 0 {
			return out
		}
		out = append(out, string(h.method))
		client = client[n:]
		var body bodyFraming
		switch {
		case h.chunked:
			body.set(bodyChunked, 0)
		case h.contentLength > 0:
			body.set(bodyLength, h.contentLength)
		default:
			body.set(bodyNone, 0)
		}
		k, err := body.take(client)
		if err != nil || !body.done {
			return out
		}
		client = client[k:]
	}
	return out
}

type fuzzHandler struct{}

// Decide forwards everything but /local, answered by the handler, and
// /off, decided on a goroutine: the three decisions of the engine.
func (fuzzHandler) Decide(w http.ResponseWriter, r *http.Request) Decision {
	switch {
	case strings.HasPrefix(r.URL.Path, "/local"):
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return Respond()
	case strings.HasPrefix(r.URL.Path, "/off"):
		return Continue(func(_ http.ResponseWriter, _ *http.Request, relay *Relay) { relay.Forward() })
	}
	return Forward()
}

// checkResponses reads what the client got as responses, one after
// another; only the last may be cut off.
func checkResponses(t *testing.T, got, client []byte) {
	methods := clientMethods(client)
	br := bufio.NewReader(strings.NewReader(string(got)))
	for i := 0; ; {
		if _, err := br.Peek(1); err != nil {
			return
		}
		req := &http.Request{Method: http.MethodGet}
		if i < len(methods) {
			req.Method = methods[i]
		}
		resp, err := http.ReadResponse(br, req)
		if err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue // interim: the same request's final response follows
		}
		i++
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return
			}
			t.Fatalf("client %q: the engine sent a response net/http cannot read (%v): %q", client, err, got)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return // a tunnel: what follows is not HTTP
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return
			}
			t.Fatalf("client %q: a response body net/http cannot read (%v): %q", client, err, got)
		}
	}
}

// fuzzUpstream answers every request with the current response bytes and
// notes the first message it could not read as a request.
type fuzzUpstream struct {
	ln       net.Listener
	response atomic.Pointer[[]byte]
	mu       sync.Mutex
	bad      error
}

func startFuzzUpstream(f *testing.F) *fuzzUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	u := &fuzzUpstream{ln: ln}
	empty := []byte{}
	u.response.Store(&empty)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u.serve(c)
			}()
		}
	}()
	f.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return u
}

func (u *fuzzUpstream) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := br.Peek(1); err != nil {
			return
		}
		req, err := http.ReadRequest(br)
		if err == nil {
			_, err = io.Copy(io.Discard, req.Body)
		}
		if err != nil {
			if !cutShort(err) {
				u.note(fmt.Errorf("the upstream cannot read what the engine sent: %w", err))
			}
			return
		}
		resp := *u.response.Load()
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// cutShort reports whether err is a message ending early (the engine gave
// up on a client and closed), not a malformed one.
func cutShort(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) || strings.Contains(err.Error(), "connection reset")
}

func (u *fuzzUpstream) note(err error) {
	u.mu.Lock()
	if u.bad == nil {
		u.bad = err
	}
	u.mu.Unlock()
}

func (u *fuzzUpstream) violation() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	err := u.bad
	u.bad = nil
	return err
}
