package eventloop_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// wireUpstream answers every request it reads with response and records,
// per connection, every byte it received up to the connection's end.
type wireUpstream struct {
	*rawUpstream
	got      chan []byte  // one entry per closed connection
	requests atomic.Int64 // requests read whole, body included
}

func startWireUpstream(t *testing.T, response string) *wireUpstream {
	t.Helper()
	u := &wireUpstream{got: make(chan []byte, 16)}
	u.rawUpstream = startRawUpstream(t, func(c net.Conn) {
		var seen bytes.Buffer
		br := bufio.NewReader(io.TeeReader(c, &seen))
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				break
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				break
			}
			u.requests.Add(1)
			if _, err := io.WriteString(c, response); err != nil {
				break
			}
		}
		_, _ = io.Copy(io.Discard, br)
		u.got <- seen.Bytes()
	})
	return u
}

// closeResponse ends each upstream connection after one answer, so that
// what the upstream recorded is all the engine ever sent on it.
const closeResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

// forwardedFields are the fields the engine adds to a request from the
// test's loopback client with Host "a".
const forwardedFields = "X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Host: a\r\nX-Forwarded-Proto: http\r\n"

// TestWireSafety sends raw requests through the engine and checks, byte for
// byte, what the upstream receives: each case is a defect found by sending
// raw bytes (issue 14) or a framing choice made on purpose.
func TestWireSafety(t *testing.T) {
	cases := []struct {
		name, request string
		wantStatus    int
		// wantUpstream is every byte the upstream receives; "" when the
		// request must not reach it.
		wantUpstream string
	}{
		{
			// Dropping Content-Length as named by Connection but relaying
			// the body made the body the upstream's second request.
			name: "connection names content-length",
			request: "POST /x HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: 36\r\n\r\n" +
				"GET /limited/S HTTP/1.1\r\nHost: a\r\n\r\n",
			wantStatus: 200,
			wantUpstream: "POST /x HTTP/1.1\r\nHost: a\r\n" + forwardedFields + "Content-Length: 36\r\n\r\n" +
				"GET /limited/S HTTP/1.1\r\nHost: a\r\n\r\n",
		},
		{
			name: "connection names transfer-encoding",
			request: "POST /x HTTP/1.1\r\nHost: a\r\nConnection: Transfer-Encoding, X-Hop\r\nX-Hop: 1\r\n" +
				"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			wantStatus: 200,
			wantUpstream: "POST /x HTTP/1.1\r\nHost: a\r\n" + forwardedFields + "Transfer-Encoding: chunked\r\n\r\n" +
				"3\r\nabc\r\n0\r\n\r\n",
		},
		{
			name:         "mixed-case chunked is sent as chunked",
			request:      "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ChUnKeD\r\n\r\n1;ext=\"v\"\r\na\r\n0\r\n\r\n",
			wantStatus:   200,
			wantUpstream: "POST /x HTTP/1.1\r\nHost: a\r\n" + forwardedFields + "Transfer-Encoding: chunked\r\n\r\n1;ext=\"v\"\r\na\r\n0\r\n\r\n",
		},
		{
			name:         "content-length with leading zeros is sent in decimal",
			request:      "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 005\r\n\r\nhello",
			wantStatus:   200,
			wantUpstream: "POST /x HTTP/1.1\r\nHost: a\r\n" + forwardedFields + "Content-Length: 5\r\n\r\nhello",
		},
		{
			name:         "repeated content-length is sent once",
			request:      "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nhi",
			wantStatus:   200,
			wantUpstream: "POST /x HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n" + forwardedFields + "Content-Length: 2\r\n\r\nhi",
		},
		{
			name: "trailers are relayed with their values",
			request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
				"2\r\nhi\r\n0\r\nX-Sum: 42\r\n\r\n",
			wantStatus: 200,
			wantUpstream: "POST /x HTTP/1.1\r\nHost: a\r\nTrailer: X-Sum\r\n" + forwardedFields +
				"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-Sum: 42\r\n\r\n",
		},
		// A fragment missed a "^/exact$" route and was forwarded
		// unlimited; an upstream that cuts it off serves /exact.
		{name: "fragment", request: "GET /exact#x HTTP/1.1\r\nHost: a\r\n\r\n", wantStatus: 400},
		{name: "fragment in the query", request: "GET /exact?a=1#x HTTP/1.1\r\nHost: a\r\n\r\n", wantStatus: 400},
		{name: "fragment in absolute form", request: "GET http://a/exact#x HTTP/1.1\r\nHost: a\r\n\r\n", wantStatus: 400},
		// The same bytes in a Host field are 400.
		{name: "absolute-form invalid host", request: "GET http://a<script>/x HTTP/1.1\r\nHost: a\r\n\r\n", wantStatus: 400},
		{name: "absolute-form host with a quote", request: "GET http://a\"b/x HTTP/1.1\r\nHost: a\r\n\r\n", wantStatus: 400},
		{name: "content-length and chunked", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n" +
			"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", wantStatus: 400},
		{name: "chunked twice", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n" +
			"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", wantStatus: 501},
		{name: "differing content-lengths", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n" +
			"Content-Length: 03\r\n\r\nabc", wantStatus: 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := startWireUpstream(t, closeResponse)
			addr := startEngine(t, proxyConfig(t, up.url()))
			c, br := dial(t, addr)
			write(t, c, tc.request)
			resp := readResponse(t, br, http.MethodGet)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d %q, want %d", resp.StatusCode, resp.body, tc.wantStatus)
			}
			if tc.wantUpstream == "" {
				expectClosed(t, c, br)
				if n := up.accepted.Load(); n != 0 {
					t.Fatalf("the upstream got %d connections, want none", n)
				}
				return
			}
			got := string(next(t, up.got))
			if got != tc.wantUpstream {
				t.Fatalf("the upstream received\n%q\nwant\n%q", got, tc.wantUpstream)
			}
			if n := up.requests.Load(); n != 1 {
				t.Fatalf("the upstream read %d requests, want 1", n)
			}
		})
	}
}

// TestRefusedTrailer: a chunked request body whose trailer section holds a
// framing, routing or forwarding field is cut off at the latest before that
// field's colon: the upstream never gets a complete message (nor the
// field), the client a 400 and the connection's end.
func TestRefusedTrailer(t *testing.T) {
	for _, name := range []string{"Content-Length", "Host", "X-Forwarded-For", "transfer-encoding", "Forwarded"} {
		t.Run(name, func(t *testing.T) {
			up := startWireUpstream(t, closeResponse)
			addr := startEngine(t, proxyConfig(t, up.url()))
			c, br := dial(t, addr)
			write(t, c, "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n"+name+": 9\r\n\r\n")
			expectAnswerThenClose(t, c, br, http.StatusBadRequest)
			got := string(next(t, up.got))
			if _, body, _ := strings.Cut(got, "\r\n\r\n"); strings.Contains(body, name+":") {
				t.Fatalf("the upstream received %q, with the refused trailer", got)
			}
			if n := up.requests.Load(); n != 0 {
				t.Fatalf("the upstream read %d complete requests, want none", n)
			}
		})
	}
}

// TestResponseFraming: what the client receives of a response whose
// framing was at stake.
func TestResponseFraming(t *testing.T) {
	t.Run("connection names content-length", func(t *testing.T) {
		// Relayed without its Content-Length on a kept-alive connection,
		// the response had no framing at all.
		up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 2\r\n\r\nok")
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		for i := range 2 {
			write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
			head, err := readHead(br)
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			if !strings.Contains(head, "\r\nContent-Length: 2\r\n") || strings.Contains(head, "Connection: Content-Length") {
				t.Fatalf("response %d head %q: want its Content-Length and no Connection naming it", i, head)
			}
			body := make([]byte, 2)
			if _, err := io.ReadFull(br, body); err != nil || string(body) != "ok" {
				t.Fatalf("response %d body %q, %v", i, body, err)
			}
		}
	})
	t.Run("content-length with leading zeros", func(t *testing.T) {
		up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 002\r\n\r\nok")
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
		head, err := readHead(br)
		if err != nil || !strings.Contains(head, "\r\nContent-Length: 2\r\n") {
			t.Fatalf("head %q, %v: want Content-Length: 2", head, err)
		}
	})
	t.Run("chunked and content-length", func(t *testing.T) {
		up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
		head, err := readHead(br)
		if err != nil || strings.Contains(head, "Content-Length") || !strings.Contains(head, "\r\nTransfer-Encoding: chunked\r\n") {
			t.Fatalf("head %q, %v: want chunked without Content-Length", head, err)
		}
	})
	for _, te := range []string{"gzip", "chunked, gzip", "gzip, chunked", "chunked,"} {
		t.Run("transfer-encoding "+te, func(t *testing.T) {
			up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: "+te+"\r\n\r\n2\r\nok\r\n0\r\n\r\n")
			addr := startEngine(t, proxyConfig(t, up.url()))
			c, br := dial(t, addr)
			write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
			if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", resp.StatusCode)
			}
		})
	}
	t.Run("chunked to an http/1.0 client", func(t *testing.T) {
		// The request goes upstream as HTTP/1.0; an upstream that answers
		// chunked anyway gets its response refused, not relayed chunked.
		up, heads := headUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /x HTTP/1.0\r\nHost: a\r\n\r\n")
		resp := readResponse(t, br, http.MethodGet)
		if resp.StatusCode != http.StatusBadGateway || len(resp.TransferEncoding) != 0 {
			t.Fatalf("status %d, transfer-encoding %q: want 502, not chunked", resp.StatusCode, resp.TransferEncoding)
		}
		if head := next(t, heads); !strings.HasPrefix(head, "GET /x HTTP/1.0\r\n") {
			t.Fatalf("upstream head %q", head)
		}
	})
	t.Run("trailers are relayed with their values", func(t *testing.T) {
		up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 7\r\n\r\n")
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\nTe: trailers\r\n\r\n")
		resp := readResponse(t, br, http.MethodGet)
		if string(resp.body) != "ok" || resp.Trailer.Get("X-Sum") != "7" {
			t.Fatalf("body %q trailer %v", resp.body, resp.Trailer)
		}
	})
	t.Run("refused response trailer cuts the response", func(t *testing.T) {
		up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nContent-Length: 7\r\n\r\n")
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
		}
		if err == nil {
			t.Fatalf("read the whole response: want it cut off")
		}
	})
}

// TestNoRetryOfPost: a reused upstream connection that closes under a
// request without answering gets the request sent again only when it is
// idempotent (RFC 9110 9.2.2); a POST, even without a body, is answered
// 502, and the upstream sees it once.
func TestNoRetryOfPost(t *testing.T) {
	for _, tc := range []struct {
		method, extra string
		retried       bool
	}{
		{"POST", "Content-Length: 0\r\n", false},
		{"POST", "", false},
		{"PATCH", "Content-Length: 0\r\n", false},
		{"POST", "Idempotency-Key: k1\r\n", true},
		{"GET", "", true},
		{"OPTIONS", "", true},
	} {
		t.Run(tc.method+" "+strings.TrimSpace(tc.extra), func(t *testing.T) {
			var served atomic.Int64
			up := startRawUpstream(t, func(c net.Conn) {
				n := 0
				serveRequests(c, func(*http.Request, []byte) string {
					served.Add(1)
					if n++; n == 2 {
						return "" // close unanswered
					}
					return okResponse
				})
			})
			addr := startEngine(t, proxyConfig(t, up.url()))
			c, br := dial(t, addr)
			write(t, c, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != 200 {
				t.Fatalf("first: %d", resp.StatusCode)
			}
			write(t, c, tc.method+" /again HTTP/1.1\r\nHost: x\r\n"+tc.extra+"\r\n")
			resp := readResponse(t, br, tc.method)
			want, wantServed, wantConns := http.StatusBadGateway, int64(2), int64(1)
			if tc.retried {
				want, wantServed, wantConns = http.StatusOK, 3, 2
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d", resp.StatusCode, want)
			}
			if got := served.Load(); got != wantServed {
				t.Fatalf("the upstream read %d requests, want %d", got, wantServed)
			}
			if got := up.accepted.Load(); got != wantConns {
				t.Fatalf("the upstream accepted %d connections, want %d", got, wantConns)
			}
		})
	}
}

// TestBodyReadTimeout: a client that stops sending its request body is cut
// off after BodyReadTimeout, its upstream connection too; one that keeps
// sending slowly is not.
func TestBodyReadTimeout(t *testing.T) {
	up := startWireUpstream(t, closeResponse)
	cfg := proxyConfig(t, up.url())
	cfg.BodyReadTimeout = 300 * time.Millisecond
	addr := startEngine(t, cfg)

	c, br := dial(t, addr)
	write(t, c, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
	expectAnswerThenClose(t, c, br, http.StatusRequestTimeout) // the sweep runs every second: within ~1.3s here
	if got := string(next(t, up.got)); !strings.HasSuffix(got, "\r\n\r\nabc") {
		t.Fatalf("the upstream received %q", got)
	}
	if n := up.requests.Load(); n != 0 {
		t.Fatalf("the upstream read %d complete requests, want none", n)
	}

	// A body whose bytes keep coming, each within the timeout, is relayed.
	c, br = dial(t, addr)
	write(t, c, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n")
	for _, b := range []string{"a", "b", "c", "d"} {
		time.Sleep(100 * time.Millisecond)
		write(t, c, b)
	}
	if resp := readResponse(t, br, http.MethodPost); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// TestAcceptBackoff: out of file descriptors, the loop stops polling the
// listener for a while (5ms doubling to 1s) instead of waking on it again
// at once, reports each pause, and serves the waiting connection once
// descriptors are free again.
func TestAcceptBackoff(t *testing.T) {
	var pauses atomic.Int64
	var lastErr atomic.Value
	up := startWireUpstream(t, okResponse)
	cfg := proxyConfig(t, up.url())
	cfg.Loops = 1
	cfg.AcceptPaused = func(err error) {
		pauses.Add(1)
		lastErr.Store(err)
	}
	addr := startEngine(t, cfg)
	// Serving (its epoll set made) before the descriptors run out.
	c0, br0 := dial(t, addr)
	write(t, c0, "GET /warm HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	if resp := readResponse(t, br0, http.MethodGet); resp.StatusCode != 200 {
		t.Fatalf("warm-up: status %d", resp.StatusCode)
	}
	// Its descriptor in the engine closed before the table is filled:
	// freed later, it would let an accept through.
	expectClosed(t, c0, br0)

	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// Fill the descriptor table up to a lowered soft limit, less one for
	// the client's socket.
	var fillers []*os.File
	release := func() {
		for _, f := range fillers {
			f.Close()
		}
		fillers = nil
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	}
	t.Cleanup(release)
	probe, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(probe.Fd()) + 64
	probe.Close()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatalf("lower RLIMIT_NOFILE: %v", err)
	}
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatalf("fill the descriptor table: %v", err)
			}
			break
		}
		fillers = append(fillers, f)
	}
	fillers[len(fillers)-1].Close()
	fillers = fillers[:len(fillers)-1]
	c, err := net.DialTimeout("tcp", addr, ioTimeout) // completes in the backlog
	if err != nil {
		release()
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	deadline := time.Now().Add(ioTimeout)
	for pauses.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// With the back-off, 300ms hold a handful of pauses (5+10+20+40+80+160ms);
	// without it, the loop would wake on the listener thousands of times.
	before := pauses.Load()
	time.Sleep(300 * time.Millisecond)
	during := pauses.Load() - before
	release()
	if before < 3 {
		t.Fatalf("%d accept pauses reported, want at least 3", before)
	}
	if during > 10 {
		t.Fatalf("%d accept pauses in 300ms: the listener is not backed off", during)
	}
	if err, _ := lastErr.Load().(error); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("pause error %v, want EMFILE", err)
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	write(t, c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp := readResponse(t, bufio.NewReader(c), http.MethodGet); resp.StatusCode != 200 {
		t.Fatalf("after the pause: status %d", resp.StatusCode)
	}
}
