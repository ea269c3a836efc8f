package eventloop_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
)

// seenRequest is what a net/http upstream's handler read of a request.
type seenRequest struct {
	method, uri, host string
	header, trailer   http.Header
	transferEncoding  []string
	contentLength     int64
	body              []byte
}

// recordingUpstream is a net/http upstream that reads each request whole,
// sends what it read on the returned channel (the first 1024 requests:
// tests that do not look never block it) and answers with respond (which
// may be nil: "ok").
func recordingUpstream(t *testing.T, respond func(w http.ResponseWriter, r *http.Request, body []byte)) (*httpUpstream, chan seenRequest) {
	seen := make(chan seenRequest, 1024)
	up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("upstream: read body: %v", err)
			return
		}
		select {
		case seen <- seenRequest{method: r.Method, uri: r.RequestURI, host: r.Host, header: r.Header.Clone(),
			trailer: r.Trailer.Clone(), transferEncoding: r.TransferEncoding, contentLength: r.ContentLength, body: body}:
		default:
		}
		if respond == nil {
			_, _ = io.WriteString(w, "ok")
			return
		}
		respond(w, r, body)
	}))
	return up, seen
}

func next[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(ioTimeout):
		t.Fatalf("nothing received in %v", ioTimeout)
		var zero T
		return zero
	}
}

// serveRequests answers the requests on c in order with respond's raw
// response, until c ends or respond returns "" (then c is closed).
func serveRequests(c net.Conn, respond func(r *http.Request, body []byte) string) {
	br := bufio.NewReader(c)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		out := respond(r, body)
		if out == "" {
			return
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
}

// parseHead splits a raw message head into its first line and fields.
func parseHead(t *testing.T, head string) (string, textproto.MIMEHeader) {
	t.Helper()
	tr := textproto.NewReader(bufio.NewReader(strings.NewReader(head)))
	line, err := tr.ReadLine()
	if err != nil {
		t.Fatalf("head %q: %v", head, err)
	}
	h, err := tr.ReadMIMEHeader()
	if err != nil {
		t.Fatalf("head %q: %v", head, err)
	}
	return line, h
}

// TestFraming relays each kind of message framing both ways.
func TestFraming(t *testing.T) {
	t.Run("GET", func(t *testing.T) {
		up, seen := recordingUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
			_, _ = io.WriteString(w, "hello "+r.URL.Path)
		})
		addr := startEngine(t, proxyConfig(t, up.URL))
		resp := get(t, client(t), addr, "/greet?x=1&y=%2F")
		if resp.StatusCode != http.StatusOK || string(resp.body) != "hello /greet" {
			t.Fatalf("got %d %q", resp.StatusCode, resp.body)
		}
		s := next(t, seen)
		if s.method != http.MethodGet || s.uri != "/greet?x=1&y=%2F" || len(s.body) != 0 {
			t.Fatalf("upstream read %s %s with %d body bytes", s.method, s.uri, len(s.body))
		}
	})

	t.Run("POST with Content-Length", func(t *testing.T) {
		up, seen := recordingUpstream(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
			_, _ = w.Write(body)
		})
		addr := startEngine(t, proxyConfig(t, up.URL))
		want := pattern(100_000, 1)
		resp, err := client(t).Post("http://"+addr+"/upload", "application/octet-stream", bytes.NewReader(want))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("echo: %v, %s", err, firstDiff(got, want))
		}
		s := next(t, seen)
		if s.contentLength != int64(len(want)) || s.transferEncoding != nil || !bytes.Equal(s.body, want) {
			t.Fatalf("upstream read Content-Length %d, Transfer-Encoding %q, body %s",
				s.contentLength, s.transferEncoding, firstDiff(s.body, want))
		}
	})

	t.Run("chunked request with trailers", func(t *testing.T) {
		up, seen := recordingUpstream(t, nil)
		addr := startEngine(t, proxyConfig(t, up.URL))
		c, br := dial(t, addr)
		write(t, c, "POST /chunked HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n"+
			"Trailer: X-Checksum\r\n\r\n"+
			"5\r\nhello\r\n6;name=value\r\n world\r\n0\r\nX-Checksum: abc123\r\n\r\n")
		if resp := readResponse(t, br, http.MethodPost); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		s := next(t, seen)
		if string(s.body) != "hello world" || len(s.transferEncoding) != 1 || s.transferEncoding[0] != "chunked" {
			t.Fatalf("upstream read body %q, Transfer-Encoding %q", s.body, s.transferEncoding)
		}
		if got := s.trailer.Get("X-Checksum"); got != "abc123" {
			t.Fatalf("upstream read trailers %v", s.trailer)
		}
	})

	t.Run("4 MiB request body to a slow reader", func(t *testing.T) {
		want := pattern(4<<20, 2)
		up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(100 * time.Millisecond) // let the engine's queue fill first
			got, err := io.ReadAll(&slowReader{r: r.Body})
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("upstream read: %v, %s", err, firstDiff(got, want))
			}
			_, _ = io.WriteString(w, strconv.Itoa(len(got)))
		}))
		addr := startEngine(t, proxyConfig(t, up.URL))
		resp, err := client(t).Post("http://"+addr+"/big", "application/octet-stream", bytes.NewReader(want))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != strconv.Itoa(len(want)) {
			t.Fatalf("upstream says it read %q bytes", got)
		}
	})

	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("4 MiB response to a slow reader, chunked=%v", chunked), func(t *testing.T) {
			want := pattern(4<<20, 3)
			up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if !chunked {
					w.Header().Set("Content-Length", strconv.Itoa(len(want)))
				}
				for b := want; len(b) > 0; b = b[min(len(b), 100_000):] {
					if _, err := w.Write(b[:min(len(b), 100_000)]); err != nil {
						return
					}
				}
			}))
			addr := startEngine(t, proxyConfig(t, up.URL))
			resp, err := client(t).Get("http://" + addr + "/big")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if chunked != (len(resp.TransferEncoding) == 1) {
				t.Errorf("Transfer-Encoding %q, Content-Length %d", resp.TransferEncoding, resp.ContentLength)
			}
			time.Sleep(100 * time.Millisecond) // let the engine's queue fill first
			got, err := io.ReadAll(&slowReader{r: resp.Body})
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read: %v, %s", err, firstDiff(got, want))
			}
		})
	}

	t.Run("chunked response with trailers", func(t *testing.T) {
		up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			_, _ = io.WriteString(w, "part one, ")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "part two")
			w.Header().Set("X-Sum", "s1")
		}))
		addr := startEngine(t, proxyConfig(t, up.URL))
		resp := get(t, client(t), addr, "/trailers")
		if string(resp.body) != "part one, part two" || len(resp.TransferEncoding) != 1 {
			t.Fatalf("body %q, Transfer-Encoding %q", resp.body, resp.TransferEncoding)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "s1" {
			t.Fatalf("trailers %v", resp.Trailer)
		}
	})

	// HEAD, 204 and 304 carry no body whatever their fields say: the
	// next response on the connection must come through whole.
	t.Run("HEAD 204 304", func(t *testing.T) {
		up := startRawUpstream(t, func(c net.Conn) {
			serveRequests(c, func(r *http.Request, _ []byte) string {
				switch r.URL.Path {
				case "/head":
					return "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
				case "/204":
					return "HTTP/1.1 204 No Content\r\nX-Status: 204\r\n\r\n"
				case "/304":
					return "HTTP/1.1 304 Not Modified\r\nContent-Length: 1000\r\nEtag: \"v1\"\r\n\r\n"
				}
				return "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nafter"
			})
		})
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		for _, tc := range []struct {
			method, path string
			status       int
		}{{"HEAD", "/head", 200}, {"GET", "/after", 200}, {"GET", "/204", 204}, {"GET", "/after", 200},
			{"GET", "/304", 304}, {"GET", "/after", 200}} {
			write(t, c, tc.method+" "+tc.path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			resp := readResponse(t, br, tc.method)
			want := ""
			if tc.path == "/after" {
				want = "after"
			}
			if resp.StatusCode != tc.status || string(resp.body) != want {
				t.Fatalf("%s %s: %d %q", tc.method, tc.path, resp.StatusCode, resp.body)
			}
			if tc.path == "/head" && resp.ContentLength != 1000 {
				t.Fatalf("HEAD: Content-Length %d, want the upstream's 1000", resp.ContentLength)
			}
		}
		if n := up.accepted.Load(); n != 1 {
			t.Fatalf("the upstream accepted %d connections, want 1", n)
		}
	})

	t.Run("close-delimited response", func(t *testing.T) {
		want := pattern(300_000, 4)
		up := startRawUpstream(t, func(c net.Conn) {
			if _, err := readHead(bufio.NewReader(c)); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
			_, _ = c.Write(want)
		})
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /eof HTTP/1.1\r\nHost: x\r\n\r\n")
		resp := readResponse(t, br, http.MethodGet)
		if !bytes.Equal(resp.body, want) {
			t.Fatalf("body: %s", firstDiff(resp.body, want))
		}
		if !resp.Close {
			t.Errorf("no Connection: close on a close-delimited response (header %v)", resp.Header)
		}
		expectClosed(t, c, br)
	})
}

// TestKeepAlive covers pipelining, upstream connection reuse and the
// rules that keep a client connection open or close it.
func TestKeepAlive(t *testing.T) {
	// Each test has its own upstream and engine, so that it counts the
	// upstream connections it alone opened.
	start := func(t *testing.T) (*httpUpstream, string) {
		up, _ := recordingUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			_, _ = io.WriteString(w, r.URL.Path+":"+string(body))
		})
		return up, startEngine(t, proxyConfig(t, up.URL))
	}

	t.Run("pipelined", func(t *testing.T) {
		up, addr := start(t)
		c, br := dial(t, addr)
		write(t, c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"+
			"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"+
			"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
		for i, want := range []string{"/a:", "/b:hello", "/c:"} {
			resp := readResponse(t, br, http.MethodGet)
			if resp.StatusCode != http.StatusOK || string(resp.body) != want {
				t.Fatalf("response %d: %d %q, want %q", i, resp.StatusCode, resp.body, want)
			}
		}
		if n := up.accepted.Load(); n != 1 {
			t.Fatalf("the upstream accepted %d connections for 3 requests on one client connection, want 1", n)
		}
	})

	t.Run("sequential requests reuse one upstream connection", func(t *testing.T) {
		up, addr := start(t)
		c, br := dial(t, addr)
		for i := range 10 {
			write(t, c, fmt.Sprintf("GET /seq/%d HTTP/1.1\r\nHost: x\r\n\r\n", i))
			resp := readResponse(t, br, http.MethodGet)
			if want := fmt.Sprintf("/seq/%d:", i); string(resp.body) != want {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, resp.body)
			}
		}
		if n := up.accepted.Load(); n != 1 {
			t.Fatalf("the upstream accepted %d connections for 10 sequential requests, want 1", n)
		}
	})

	// (http.ReadResponse takes "Connection: close" out of the header
	// into resp.Close.)
	t.Run("HTTP/1.0 closes", func(t *testing.T) {
		_, addr := start(t)
		c, br := dial(t, addr)
		write(t, c, "GET /ten HTTP/1.0\r\n\r\n")
		resp := readResponse(t, br, http.MethodGet)
		if string(resp.body) != "/ten:" || !resp.Close {
			t.Fatalf("%q, close %v", resp.body, resp.Close)
		}
		expectClosed(t, c, br)
	})

	t.Run("HTTP/1.0 keep-alive", func(t *testing.T) {
		_, addr := start(t)
		c, br := dial(t, addr)
		for i := range 3 {
			write(t, c, fmt.Sprintf("GET /ten/%d HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", i))
			resp := readResponse(t, br, http.MethodGet)
			if string(resp.body) != fmt.Sprintf("/ten/%d:", i) || resp.Header.Get("Connection") != "keep-alive" {
				t.Fatalf("request %d: %q, Connection %q", i, resp.body, resp.Header.Get("Connection"))
			}
		}
	})

	t.Run("Connection: close", func(t *testing.T) {
		_, addr := start(t)
		c, br := dial(t, addr)
		write(t, c, "GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp := readResponse(t, br, http.MethodGet)
		if string(resp.body) != "/bye:" || !resp.Close {
			t.Fatalf("%q, close %v", resp.body, resp.Close)
		}
		expectClosed(t, c, br)
	})
}

// headUpstream answers every request "ok" and sends the raw head it read
// on the returned channel.
func headUpstream(t *testing.T, response string) (*rawUpstream, chan string) {
	heads := make(chan string, 16)
	up := startRawUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			head, err := readHead(br)
			if err != nil {
				return
			}
			heads <- head
			if _, err := io.WriteString(c, response); err != nil {
				return
			}
		}
	})
	return up, heads
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// TestHeaders checks what is relayed of each head, both ways.
func TestHeaders(t *testing.T) {
	const hopByHopRequest = "GET /h?q=1 HTTP/1.1\r\n" +
		"X-Before-Host: 1\r\n" +
		"Host: front.example\r\n" +
		"Connection: keep-alive, X-Conn-Named\r\n" +
		"Keep-Alive: timeout=5\r\n" +
		"Proxy-Connection: keep-alive\r\n" +
		"Te: trailers, deflate\r\n" +
		"Upgrade: h2c\r\n" +
		"X-Conn-Named: secret\r\n" +
		"X-Forwarded-For: 203.0.113.7\r\n" +
		"X-Forwarded-For: 198.51.100.1\r\n" +
		"X-Forwarded-Host: evil.example\r\n" +
		"X-Forwarded-Proto: https\r\n" +
		"X-Kept: yes\r\n" +
		"\r\n"

	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("request trusted=%v", trusted), func(t *testing.T) {
			up, heads := headUpstream(t, okResponse)
			cfg := proxyConfig(t, up.url())
			if trusted {
				cfg.TrustedPeer = func(a netip.Addr) bool { return a.IsLoopback() }
			}
			addr := startEngine(t, cfg)
			c, br := dial(t, addr)
			write(t, c, hopByHopRequest)
			if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			line, h := parseHead(t, next(t, heads))
			if line != "GET /h?q=1 HTTP/1.1" {
				t.Errorf("request line %q", line)
			}
			for _, name := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Upgrade", "X-Conn-Named"} {
				if v, ok := h[name]; ok {
					t.Errorf("hop-by-hop %s relayed: %q", name, v)
				}
			}
			xff := "127.0.0.1"
			if trusted {
				xff = "203.0.113.7, 198.51.100.1, 127.0.0.1"
			}
			for name, want := range map[string][]string{
				"Host":              {"front.example"},
				"Te":                {"trailers"},
				"X-Kept":            {"yes"},
				"X-Before-Host":     {"1"},
				"X-Forwarded-For":   {xff},
				"X-Forwarded-Host":  {"front.example"},
				"X-Forwarded-Proto": {"http"},
			} {
				if got := h[name]; fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
		})
	}

	t.Run("response", func(t *testing.T) {
		up, _ := headUpstream(t, "HTTP/1.1 200 OK\r\n"+
			"Content-Length: 2\r\n"+
			"Connection: X-Resp-Named\r\n"+
			"X-Resp-Named: secret\r\n"+
			"Keep-Alive: timeout=5\r\n"+
			"Proxy-Connection: keep-alive\r\n"+
			"Upgrade: h2c\r\n"+
			"Te: trailers\r\n"+
			"X-Resp-Kept: yes\r\n"+
			"\r\nok")
		cfg := proxyConfig(t, up.url())
		cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
			w.Header().Set("Ratelimit-Policy", "10;w=1")
			w.Header().Set("Ratelimit", "limit=10, remaining=9, reset=1")
			forward()
		})
		addr := startEngine(t, cfg)
		c, br := dial(t, addr)
		for range 2 {
			write(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			head, err := readHead(br)
			if err != nil {
				t.Fatal(err)
			}
			body := make([]byte, 2)
			if _, err := io.ReadFull(br, body); err != nil || string(body) != "ok" {
				t.Fatalf("body %q: %v", body, err)
			}
			line, h := parseHead(t, head)
			if line != "HTTP/1.1 200 OK" {
				t.Errorf("status line %q", line)
			}
			for _, name := range []string{"Connection", "X-Resp-Named", "Keep-Alive", "Proxy-Connection", "Upgrade", "Te"} {
				if v, ok := h[name]; ok {
					t.Errorf("hop-by-hop %s relayed: %q", name, v)
				}
			}
			for name, want := range map[string]string{
				"X-Resp-Kept":      "yes",
				"Ratelimit-Policy": "10;w=1",
				"Ratelimit":        "limit=10, remaining=9, reset=1",
				"Content-Length":   "2",
			} {
				if got := h.Values(name); len(got) != 1 || got[0] != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
		}
	})

	// The upstream URL's path goes in front of the request's, its query
	// in front of the request's query (httputil.ProxyRequest.SetURL).
	for _, tc := range []struct{ upstreamPath, target, want string }{
		{"/base", "/x/y?q=1", "/base/x/y?q=1"},
		{"/base/", "/x/y", "/base/x/y"},
		{"/base?k=v", "/x/y?q=1", "/base/x/y?k=v&q=1"},
		{"/base?k=v", "/", "/base/?k=v"},
		{"/base", "/a%3Fb", "/base/a%3Fb"},
		{"/base", "/a%2Fb", "/base/a/b"}, // the normal form (internal/l7/target)
		{"/base", "//x/../a?q", "/base/a?q"},
	} {
		t.Run("upstream path "+tc.upstreamPath+" "+tc.target, func(t *testing.T) {
			up, heads := headUpstream(t, okResponse)
			addr := startEngine(t, proxyConfig(t, up.url()+tc.upstreamPath))
			c, br := dial(t, addr)
			// Two requests: the second finds the upstream connection in the
			// pool, and its head in a buffer the first one used.
			for range 2 {
				write(t, c, "GET "+tc.target+" HTTP/1.1\r\nHost: front.example\r\n"+
					"User-Agent: edgeguard-test/1.0\r\nAccept: */*\r\nX-Long: "+strings.Repeat("v", 300)+"\r\n\r\n")
				if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				line, h := parseHead(t, next(t, heads))
				if want := "GET " + tc.want + " HTTP/1.1"; line != want {
					t.Errorf("request line %q, want %q", line, want)
				}
				if h.Get("User-Agent") != "edgeguard-test/1.0" || h.Get("Accept") != "*/*" ||
					h.Get("X-Long") != strings.Repeat("v", 300) || h.Get("Host") != "front.example" {
					t.Errorf("fields changed on the way: %q", h)
				}
			}
		})
	}
}

// TestHandlerAnswers: a response the handler writes itself.
func TestHandlerAnswers(t *testing.T) {
	up, seen := recordingUpstream(t, nil)
	cfg := proxyConfig(t, up.URL)
	cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
		if r.URL.Path != "/limited" {
			forward()
			return
		}
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, "slow down\n")
	})
	addr := startEngine(t, cfg)

	check := func(t *testing.T, resp response) {
		t.Helper()
		if resp.StatusCode != http.StatusTooManyRequests || string(resp.body) != "slow down\n" ||
			resp.Header.Get("Retry-After") != "1" || resp.ContentLength != int64(len("slow down\n")) {
			t.Fatalf("got %d %q %v", resp.StatusCode, resp.body, resp.Header)
		}
		if _, err := http.ParseTime(resp.Header.Get("Date")); err != nil {
			t.Fatalf("Date %q: %v", resp.Header.Get("Date"), err)
		}
	}

	t.Run("no body", func(t *testing.T) {
		check(t, get(t, client(t), addr, "/limited"))
	})

	t.Run("body read whole: the connection stays", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world")
		resp := readResponse(t, br, http.MethodPost)
		check(t, resp)
		if resp.Close {
			t.Fatalf("connection closed after a body read whole")
		}
		write(t, c, "GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
			t.Fatalf("next request: %d %q", resp.StatusCode, resp.body)
		}
		if s := next(t, seen); s.uri != "/after" {
			t.Fatalf("upstream read %s", s.uri)
		}
	})

	t.Run("body still coming: the connection closes", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nthe start")
		resp := readResponse(t, br, http.MethodPost)
		check(t, resp)
		if !resp.Close {
			t.Fatalf("no Connection: close with the body unread")
		}
		expectClosed(t, c, br)
	})

	t.Run("HEAD", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "HEAD /limited HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
		resp := readResponse(t, br, http.MethodHead)
		if resp.StatusCode != http.StatusTooManyRequests || len(resp.body) != 0 {
			t.Fatalf("HEAD: %d %q", resp.StatusCode, resp.body)
		}
		if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
			t.Fatalf("next request: %d %q", resp.StatusCode, resp.body)
		}
	})
}

// TestMayBlock: a handler that may block runs on its own goroutine while
// the loop serves other connections.
func TestMayBlock(t *testing.T) {
	upstreamGot := make(chan string, 4)
	answer := make(chan struct{}) // the upstream holds /block's answer until closed
	up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			upstreamGot <- r.URL.Path
			select {
			case <-answer:
			case <-time.After(ioTimeout):
			}
		}
		_, _ = io.WriteString(w, "upstream "+r.URL.Path)
	}))
	entered := make(chan string, 4)
	release := make(chan struct{})
	forwarded := make(chan bool, 4)
	cfg := proxyConfig(t, up.URL)
	cfg.Loops = 1 // the blocked handler and the other client share one loop
	cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
		if strings.HasPrefix(r.URL.Path, "/block") {
			entered <- r.URL.Path
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		if r.URL.Path == "/block/deny" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "queue full\n")
			return
		}
		w.Header().Set("X-Handler", "was here")
		forward()
		ok := true
		if strings.HasPrefix(r.URL.Path, "/block") {
			forwarded <- ok
		}
	})
	cfg.Handler = onGoroutine(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/block") }, cfg.Handler)
	addr := startEngine(t, cfg)
	t.Cleanup(func() {
		for _, ch := range []chan struct{}{release, answer} {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	})

	t.Run("blocked handler, other connections served, Forward relays", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
		if p := next(t, entered); p != "/block" {
			t.Fatalf("entered %q", p)
		}
		// The handler is blocked: another client is served meanwhile.
		if resp := get(t, client(t), addr, "/other"); string(resp.body) != "upstream /other" {
			t.Fatalf("other client: %d %q", resp.StatusCode, resp.body)
		}
		close(release)
		next(t, upstreamGot)
		// Forward waits for the upstream's answer.
		select {
		case <-forwarded:
			t.Fatalf("Forward returned before the upstream answered")
		case <-time.After(100 * time.Millisecond):
		}
		close(answer)
		resp := readResponse(t, br, http.MethodGet)
		if string(resp.body) != "upstream /block" || resp.Header.Get("X-Handler") != "was here" {
			t.Fatalf("blocked request: %d %q %v", resp.StatusCode, resp.body, resp.Header)
		}
		if ok := next(t, forwarded); !ok {
			t.Fatalf("Forward refused the engine's writer")
		}
		// The connection goes on, with blocking and non-blocking requests.
		write(t, c, "GET /block/deny HTTP/1.1\r\nHost: x\r\n\r\nGET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
		next(t, entered)
		if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusServiceUnavailable ||
			string(resp.body) != "queue full\n" {
			t.Fatalf("denied: %d %q", resp.StatusCode, resp.body)
		}
		if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "upstream /plain" {
			t.Fatalf("plain: %d %q", resp.StatusCode, resp.body)
		}
	})

	t.Run("client gone: the request's context ends", func(t *testing.T) {
		blocking := make(chan struct{})
		cancelled := make(chan struct{}, 1)
		cfg := proxyConfig(t, up.URL)
		cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
			entered <- r.URL.Path
			select {
			case <-blocking:
			case <-r.Context().Done():
				cancelled <- struct{}{}
			}
		})
		cfg.Handler = onGoroutine(func(*http.Request) bool { return true }, cfg.Handler)
		addr := startEngine(t, cfg)
		t.Cleanup(func() { close(blocking) })
		c, _ := dial(t, addr)
		write(t, c, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
		next(t, entered)
		c.Close()
		next(t, cancelled)
	})
}

// TestUpgrade: a 101 turns the connection into a tunnel; a 101 nobody
// asked for is a bad gateway.
func TestUpgrade(t *testing.T) {
	heads := make(chan string, 1)
	ends := make(chan string, 4) // the upstream saw the client's end
	up := startRawUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		head, err := readHead(br)
		if err != nil {
			return
		}
		heads <- head
		if !strings.Contains(head, "Upgrade: websocket") {
			_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello\n")
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				ends <- "client"
				return
			}
			if _, err := io.WriteString(c, strings.ToUpper(line)); err != nil || line == "bye\n" {
				return // and close
			}
		}
	})
	addr := startEngine(t, proxyConfig(t, up.url()))

	t.Run("101 then bytes both ways", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		head, err := readHead(br)
		if err != nil {
			t.Fatal(err)
		}
		line, h := parseHead(t, head)
		if line != "HTTP/1.1 101 Switching Protocols" || h.Get("Upgrade") != "websocket" || h.Get("Connection") != "Upgrade" {
			t.Fatalf("client got %q", head)
		}
		_, uh := parseHead(t, next(t, heads))
		if uh.Get("Upgrade") != "websocket" || uh.Get("Connection") != "Upgrade" {
			t.Fatalf("upstream got %q", uh)
		}
		if line, err := br.ReadString('\n'); line != "hello\n" {
			t.Fatalf("first tunnel bytes %q: %v", line, err)
		}
		for i := range 50 {
			msg := fmt.Sprintf("message %d %s\n", i, strings.Repeat("x", i*100))
			write(t, c, msg)
			if got, err := br.ReadString('\n'); got != strings.ToUpper(msg) {
				t.Fatalf("echo %d: %q: %v", i, got, err)
			}
		}
		c.Close()
		if who := next(t, ends); who != "client" {
			t.Fatalf("end %q", who)
		}
	})

	// Bytes sent right behind the upgrade request, before the 101, go
	// through the tunnel too; when the upstream closes, the client gets
	// what it sent, then the end.
	t.Run("early bytes, upstream closes", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nearly\n")
		if head, err := readHead(br); err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
			t.Fatalf("head %q: %v", head, err)
		}
		next(t, heads)
		for _, want := range []string{"hello\n", "EARLY\n"} {
			if got, err := br.ReadString('\n'); got != want {
				t.Fatalf("got %q, want %q: %v", got, want, err)
			}
		}
		write(t, c, "bye\n")
		if got, err := br.ReadString('\n'); got != "BYE\n" {
			t.Fatalf("got %q: %v", got, err)
		}
		expectClosed(t, c, br)
	})

	t.Run("101 without an upgrade asked for", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "GET /no-upgrade HTTP/1.1\r\nHost: x\r\n\r\n")
		next(t, heads)
		if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", resp.StatusCode)
		}
	})
}

// TestContinue: the upstream's 100 Continue reaches the client, which then
// sends its body.
func TestContinue(t *testing.T) {
	up, seen := recordingUpstream(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
		_, _ = w.Write(body)
	})
	addr := startEngine(t, proxyConfig(t, up.URL))
	c, br := dial(t, addr)
	write(t, c, "POST /upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	head, err := readHead(br)
	if err != nil {
		t.Fatal(err)
	}
	if line, _ := parseHead(t, head); line != "HTTP/1.1 100 Continue" {
		t.Fatalf("interim %q", head)
	}
	write(t, c, "hello")
	if resp := readResponse(t, br, http.MethodPost); resp.StatusCode != http.StatusOK || string(resp.body) != "hello" {
		t.Fatalf("final: %d %q", resp.StatusCode, resp.body)
	}
	if s := next(t, seen); string(s.body) != "hello" {
		t.Fatalf("upstream read %q", s.body)
	}
}

// TestUpstreamFailures: what the client gets when the upstream refuses,
// closes or resets.
func TestUpstreamFailures(t *testing.T) {
	t.Run("nothing listening: BadGateway", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := "http://" + ln.Addr().String()
		ln.Close()
		called := make(chan error, 4)
		cfg := proxyConfig(t, dead)
		cfg.BadGateway = func(w http.ResponseWriter, r *http.Request, err error) {
			called <- err
			w.Header().Set("X-Bad-Gateway", r.URL.Path)
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "no upstream\n")
		}
		addr := startEngine(t, cfg)
		c, br := dial(t, addr)
		for range 2 {
			write(t, c, "GET /down HTTP/1.1\r\nHost: x\r\n\r\n")
			resp := readResponse(t, br, http.MethodGet)
			if resp.StatusCode != http.StatusBadGateway || string(resp.body) != "no upstream\n" ||
				resp.Header.Get("X-Bad-Gateway") != "/down" {
				t.Fatalf("got %d %q %v", resp.StatusCode, resp.body, resp.Header)
			}
			if err := next(t, called); err == nil {
				t.Fatalf("BadGateway called with a nil error")
			}
		}
	})

	t.Run("nothing listening: default 502", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := "http://" + ln.Addr().String()
		ln.Close()
		addr := startEngine(t, proxyConfig(t, dead))
		if resp := get(t, client(t), addr, "/down"); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("got %d %q", resp.StatusCode, resp.body)
		}
	})

	t.Run("upstream closes its idle connection", func(t *testing.T) {
		up, _ := recordingUpstream(t, nil)
		addr := startEngine(t, proxyConfig(t, up.URL))
		c, br := dial(t, addr)
		for i := range 3 {
			write(t, c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, resp.body)
			}
			up.CloseClientConnections()
		}
	})

	// The upstream reads the second request on each connection and closes
	// it unanswered (its idle close raced with the request): the engine
	// retries once on a fresh connection.
	t.Run("upstream closes a reused connection under a request", func(t *testing.T) {
		up := startRawUpstream(t, func(c net.Conn) {
			n := 0
			serveRequests(c, func(*http.Request, []byte) string {
				if n++; n == 2 {
					return ""
				}
				return okResponse
			})
		})
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		for i := range 3 {
			write(t, c, "GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, resp.body)
			}
		}
		if n := up.accepted.Load(); n != 3 {
			t.Fatalf("the upstream accepted %d connections, want 3 (one, then one per retry)", n)
		}
	})

	t.Run("upstream resets mid-response", func(t *testing.T) {
		up := startRawUpstream(t, func(c net.Conn) {
			if _, err := readHead(bufio.NewReader(c)); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
			_, _ = c.Write(pattern(1000, 5))
			time.Sleep(50 * time.Millisecond)
			_ = c.(*net.TCPConn).SetLinger(0)
		})
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET /cut HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if err == nil || len(got) >= 100000 {
			t.Fatalf("read %d bytes of 100000, err %v: want a truncated body", len(got), err)
		}
		expectClosed(t, c, br)
	})
}

// TestMalformed: a head the engine refuses is answered with its status,
// then the connection closes.
func TestMalformed(t *testing.T) {
	up, seen := recordingUpstream(t, nil)
	addr := startEngine(t, proxyConfig(t, up.URL))
	for _, tc := range []struct {
		name, in string
		status   int
	}{
		{"bad request line", "GARBAGE\r\n\r\n", 400},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", 400},
		{"Content-Length and Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
		{"70 KiB head", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", 431},
		{"Transfer-Encoding gzip", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := dial(t, addr)
			go func() { _, _ = io.WriteString(c, tc.in) }() // the engine may stop reading first
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || !resp.Close {
				t.Fatalf("status %d close %v, want %d and close", resp.StatusCode, resp.Close, tc.status)
			}
			if _, err := io.ReadAll(resp.Body); err != nil && !isReset(err) {
				t.Fatal(err)
			}
			expectClosed(t, c, br)
		})
	}
	select {
	case s := <-seen:
		t.Fatalf("a malformed request reached the upstream: %s %s", s.method, s.uri)
	default:
	}

	// The head is fine and goes upstream, then the body turns out not to
	// be: the engine cuts the upstream connection, answers 400 (as the
	// net-http engine does) and closes.
	t.Run("bad chunk", func(t *testing.T) {
		got := make(chan string, 2)
		up := startRawUpstream(t, func(c net.Conn) {
			br := bufio.NewReader(c)
			if _, err := readHead(br); err != nil {
				return
			}
			size, _ := br.ReadString('\n')
			data, _ := br.ReadString('\n')
			got <- size + data
			_, _ = io.Copy(io.Discard, br)
			got <- "closed"
		})
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		if s := next(t, got); s != "5\r\nhello\r\n" {
			t.Fatalf("upstream read %q", s)
		}
		write(t, c, "zz\r\n")
		expectAnswerThenClose(t, c, br, http.StatusBadRequest)
		if s := next(t, got); s != "closed" {
			t.Fatalf("upstream: %q", s)
		}
	})
}

// TestTimeouts: a head that does not come in time and an idle kept-alive
// connection are closed (the sweep runs once a second).
func TestTimeouts(t *testing.T) {
	// timeoutBound is long past the timeouts set here plus a sweep, and
	// short of the defaults (10s, 2m) the engine would use if it ignored
	// them.
	const timeoutBound = 5 * time.Second
	up, _ := recordingUpstream(t, nil)
	cfg := proxyConfig(t, up.URL)
	cfg.ReadHeaderTimeout = 300 * time.Millisecond
	cfg.IdleTimeout = 500 * time.Millisecond
	addr := startEngine(t, cfg)

	t.Run("partial head", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "GET /slow HTTP/1.1\r\nHost:")
		expectClosedWithin(t, c, br, timeoutBound)
	})

	t.Run("idle kept-alive connection", func(t *testing.T) {
		c, br := dial(t, addr)
		write(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
			t.Fatalf("got %d %q", resp.StatusCode, resp.body)
		}
		expectClosedWithin(t, c, br, timeoutBound)
	})

	t.Run("connection that never sends", func(t *testing.T) {
		c, br := dial(t, addr)
		expectClosedWithin(t, c, br, timeoutBound)
	})

	// Its first request is not a kept-alive connection's next one: as
	// under net/http, ReadHeaderTimeout bounds the wait for it, however
	// long IdleTimeout is.
	t.Run("connection that never sends, long IdleTimeout", func(t *testing.T) {
		cfg := cfg
		cfg.IdleTimeout = time.Minute
		c, br := dial(t, startEngine(t, cfg))
		expectClosedWithin(t, c, br, timeoutBound)
	})
}

// TestShutdown: a context's end lets requests in flight finish; past
// ShutdownTimeout the rest are cut.
func TestShutdown(t *testing.T) {
	t.Run("graceful", func(t *testing.T) {
		started := make(chan struct{}, 1)
		up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				started <- struct{}{}
				time.Sleep(300 * time.Millisecond)
			}
			_, _ = io.WriteString(w, "finished")
		}))
		e := runEngine(t, proxyConfig(t, up.URL))
		idle, idleBR := dial(t, e.addr) // kept-alive, between requests
		write(t, idle, "GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp := readResponse(t, idleBR, http.MethodGet); string(resp.body) != "finished" {
			t.Fatalf("got %d %q", resp.StatusCode, resp.body)
		}
		c, br := dial(t, e.addr)
		write(t, c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		next(t, started)
		e.cancel() // with c's request in flight
		resp := readResponse(t, br, http.MethodGet)
		if resp.StatusCode != http.StatusOK || string(resp.body) != "finished" {
			t.Fatalf("in-flight request: %d %q", resp.StatusCode, resp.body)
		}
		if !resp.Close {
			t.Errorf("no Connection: close on the last response of a shutdown")
		}
		expectClosed(t, c, br)
		expectClosed(t, idle, idleBR)
		if err := e.wait(t, ioTimeout); err != nil {
			t.Fatalf("Serve: %v", err)
		}
		if c, err := net.DialTimeout("tcp", e.addr, ioTimeout); err == nil {
			c.Close()
			t.Fatalf("a connection was accepted after Serve returned")
		}
	})

	t.Run("timeout", func(t *testing.T) {
		reading := make(chan struct{}, 1)
		up := startRawUpstream(t, func(c net.Conn) {
			reading <- struct{}{}
			_, _ = io.Copy(io.Discard, c) // never answers
		})
		cfg := proxyConfig(t, up.url())
		cfg.ShutdownTimeout = 200 * time.Millisecond
		e := runEngine(t, cfg)
		c, br := dial(t, e.addr)
		write(t, c, "GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
		next(t, reading)
		e.cancel()
		err := e.wait(t, 5*time.Second)
		if err == nil {
			t.Fatalf("Serve returned nil with a request in flight past ShutdownTimeout")
		}
		t.Logf("Serve: %v", err)
		expectClosed(t, c, br)
	})
}

// TestConcurrency: many clients at once, mixed GET and POST, every body
// where it belongs.
func TestConcurrency(t *testing.T) {
	const clients, requests = 32, 200
	up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			// Read whole first: io.Copy would start the response after 512
			// bytes, and net/http's HTTP/1 server then ends the request
			// body (see http.ResponseWriter's Write).
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("upstream: %v", err)
			}
			_, _ = w.Write(body)
			return
		}
		_, _ = io.WriteString(w, "path="+r.URL.Path)
	}))
	addr := startEngine(t, proxyConfig(t, up.URL))
	hc := client(t)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for j := range requests {
					var (
						resp *http.Response
						err  error
						want []byte
					)
					if j%2 == 0 {
						path := fmt.Sprintf("/c/%d/%d", i, j)
						want = []byte("path=" + path)
						resp, err = hc.Get("http://" + addr + path)
					} else {
						want = pattern(1+(i*j*97)%40_000, byte(i+j))
						resp, err = hc.Post("http://"+addr+"/echo", "application/octet-stream", bytes.NewReader(want))
					}
					if err != nil {
						return fmt.Errorf("client %d request %d: %w", i, j, err)
					}
					got, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
						return fmt.Errorf("client %d request %d: status %d, %v, %s", i, j, resp.StatusCode, err, firstDiff(got, want))
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		if err != nil {
			all = append(all, err)
		}
	}
	if err := errors.Join(all...); err != nil {
		t.Fatal(err)
	}
}

// TestClientCloses: a client that closes its side mid-head is closed at
// once, not when a timeout runs out.
func TestClientCloses(t *testing.T) {
	up, _ := recordingUpstream(t, nil)
	addr := startEngine(t, proxyConfig(t, up.URL)) // ReadHeaderTimeout 10s
	// The head and the FIN come in one read or in two: try a few times.
	for range 20 {
		c, br := dial(t, addr)
		write(t, c, "GET /partial HTTP/1.1\r\nHost:")
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		// Far below the 10s ReadHeaderTimeout.
		expectClosedWithin(t, c, br, 5*time.Second)
	}
}

// TestHandlerPanics: a handler that panics before deciding gets a 500 and
// the connection closes; one that panics after its Forward returned has
// already had its response relayed, and nothing follows it.
func TestHandlerPanics(t *testing.T) {
	up, _ := recordingUpstream(t, nil)
	cfg := proxyConfig(t, up.URL)
	cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
		if strings.HasSuffix(r.URL.Path, "/after") {
			forward()
		}
		panic("handler bug")
	})
	cfg.Handler = onGoroutine(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/async") }, cfg.Handler)
	addr := startEngine(t, cfg)
	for _, path := range []string{"/sync", "/async", "/async/after"} {
		t.Run(path, func(t *testing.T) {
			c, br := dial(t, addr)
			write(t, c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			resp := readResponse(t, br, http.MethodGet)
			want := http.StatusInternalServerError
			if path == "/async/after" {
				want = http.StatusOK
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d (%q)", resp.StatusCode, want, resp.body)
			}
			expectClosed(t, c, br)
		})
	}
}

// TestMoreFraming: corners of the relay the other tests pass by.
func TestMoreFraming(t *testing.T) {
	t.Run("absolute-form target", func(t *testing.T) {
		up, heads := headUpstream(t, okResponse)
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET http://origin.example/p?q=1 HTTP/1.1\r\nHost: ignored.example\r\n\r\n")
		if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		line, h := parseHead(t, next(t, heads))
		if line != "GET /p?q=1 HTTP/1.1" || h.Get("Host") != "origin.example" {
			t.Fatalf("upstream got %q with Host %q", line, h.Get("Host"))
		}
	})

	t.Run("interim 103 then the response", func(t *testing.T) {
		up, _ := headUpstream(t, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"+okResponse)
		addr := startEngine(t, proxyConfig(t, up.url()))
		c, br := dial(t, addr)
		write(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		head, err := readHead(br)
		if err != nil {
			t.Fatal(err)
		}
		if line, h := parseHead(t, head); line != "HTTP/1.1 103 Early Hints" || h.Get("Link") == "" {
			t.Fatalf("interim %q", head)
		}
		if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
			t.Fatalf("final %d %q", resp.StatusCode, resp.body)
		}
	})

	t.Run("pipelined, answered by the handler and the upstream in turn", func(t *testing.T) {
		up, _ := recordingUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
			_, _ = io.WriteString(w, "upstream "+r.URL.Path)
		})
		cfg := proxyConfig(t, up.URL)
		cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
			if strings.HasPrefix(r.URL.Path, "/local") {
				_, _ = io.WriteString(w, "handler "+r.URL.Path)
				return
			}
			forward()
		})
		addr := startEngine(t, cfg)
		c, br := dial(t, addr)
		var in strings.Builder
		var want []string
		for i := range 100 {
			path := fmt.Sprintf("/up/%d", i)
			who := "upstream "
			if i%3 == 0 {
				path, who = fmt.Sprintf("/local/%d", i), "handler "
			}
			in.WriteString("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")
			want = append(want, who+path)
		}
		write(t, c, in.String())
		for i, w := range want {
			if resp := readResponse(t, br, http.MethodGet); string(resp.body) != w {
				t.Fatalf("response %d: %d %q, want %q", i, resp.StatusCode, resp.body, w)
			}
		}
	})

	t.Run("pipelined chunked bodies", func(t *testing.T) {
		up, seen := recordingUpstream(t, nil)
		addr := startEngine(t, proxyConfig(t, up.URL))
		c, br := dial(t, addr)
		req := "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
		write(t, c, req+req+"GET /end HTTP/1.1\r\nHost: x\r\n\r\n")
		for range 3 {
			if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
				t.Fatalf("%d %q", resp.StatusCode, resp.body)
			}
		}
		for _, want := range []string{"abc", "abc", ""} {
			if s := next(t, seen); string(s.body) != want {
				t.Fatalf("upstream read %s %q, want %q", s.uri, s.body, want)
			}
		}
	})

	for _, tc := range []struct{ name, response string }{
		{"malformed response head", "HTTP/1.1 abc\r\n\r\n"},
		{"response head over 64 KiB", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", 70<<10) + "\r\n\r\n"},
		{"closed before a response", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRawUpstream(t, func(c net.Conn) {
				if _, err := readHead(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = io.WriteString(c, tc.response)
			})
			addr := startEngine(t, proxyConfig(t, up.url()))
			c, br := dial(t, addr)
			write(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", resp.StatusCode)
			}
		})
	}
}

// TestShutdownBlockedHandler: a handler on its goroutine at shutdown
// finishes its request when it can, and has its context cancelled when
// ShutdownTimeout runs out.
func TestShutdownBlockedHandler(t *testing.T) {
	up, _ := recordingUpstream(t, nil)
	for _, timeout := range []bool{false, true} {
		t.Run(fmt.Sprintf("timeout=%v", timeout), func(t *testing.T) {
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			cfg := proxyConfig(t, up.URL)
			if timeout {
				cfg.ShutdownTimeout = 200 * time.Millisecond
			}
			cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
				entered <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				forward()
			})
			cfg.Handler = onGoroutine(func(*http.Request) bool { return true }, cfg.Handler)
			e := runEngine(t, cfg)
			c, br := dial(t, e.addr)
			write(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			next(t, entered)
			e.cancel()
			if timeout {
				if err := e.wait(t, 5*time.Second); err == nil {
					t.Fatalf("Serve returned nil with a handler blocked past ShutdownTimeout")
				}
				close(release)
				expectClosed(t, c, br)
				return
			}
			time.Sleep(100 * time.Millisecond) // the drain has begun
			close(release)
			resp := readResponse(t, br, http.MethodGet)
			if string(resp.body) != "ok" || !resp.Close {
				t.Fatalf("got %d %q close %v", resp.StatusCode, resp.body, resp.Close)
			}
			expectClosed(t, c, br)
			if err := e.wait(t, ioTimeout); err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}
}

// TestIPv6: clients and the upstream on ::1.
func TestIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	heads := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(ioTimeout))
		head, _ := readHead(bufio.NewReader(c))
		heads <- head
		_, _ = io.WriteString(c, okResponse)
	}()
	t.Cleanup(func() { ln.Close() })
	srv, err := eventloop.New(proxyConfig(t, "http://"+ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	front, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	e := serveEngine(t, srv, front)
	e.expectCleanEnd(t)
	c, br := dial(t, e.addr)
	write(t, c, "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n")
	if resp := readResponse(t, br, http.MethodGet); string(resp.body) != "ok" {
		t.Fatalf("%d %q", resp.StatusCode, resp.body)
	}
	if _, h := parseHead(t, next(t, heads)); h.Get("X-Forwarded-For") != "::1" || h.Get("Host") != "[::1]" {
		t.Fatalf("upstream got X-Forwarded-For %q, Host %q", h.Get("X-Forwarded-For"), h.Get("Host"))
	}
}

// TestAbortingClients: clients that reset their connection right after
// their request, among clients that wait for their answer, on one loop.
// Every waiting client gets its answer: the fds the aborted connections
// (and their upstream connections) free are reused at once, and an event
// of the old connection must not reach the new one.
func TestAbortingClients(t *testing.T) {
	up := startRawUpstream(t, func(c net.Conn) {
		if _, err := readHead(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
	})
	cfg := proxyConfig(t, up.url())
	cfg.Loops = 1
	addr := startEngine(t, cfg)
	const workers, rounds = 24, 400
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				c, err := net.DialTimeout("tcp", addr, ioTimeout)
				if err != nil {
					errs <- err
					return
				}
				_ = c.SetDeadline(time.Now().Add(ioTimeout))
				_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				if i%2 == 0 {
					time.Sleep(time.Duration(i*10) * time.Microsecond)
					_ = c.(*net.TCPConn).SetLinger(0) // a reset
					c.Close()
					continue
				}
				var resp *http.Response
				if err == nil {
					resp, err = http.ReadResponse(bufio.NewReader(c), nil)
				}
				if err == nil {
					var body []byte
					body, err = io.ReadAll(resp.Body)
					if err == nil && string(body) != "ok" {
						err = fmt.Errorf("body %q", body)
					}
				}
				c.Close()
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", i, j, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestMixedTraffic: keep-alive clients sending GETs with bodies of every
// size, Content-Length and chunked POSTs, to handlers on the loop and on
// goroutines, some answered by the handler; among them clients that stop
// anywhere in a request and leave (closing or resetting). Every client
// that stays gets exactly its answers.
func TestMixedTraffic(t *testing.T) {
	up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if n, _ := strconv.Atoi(r.URL.Query().Get("n")); n > 0 {
			w.Header().Set("Content-Length", strconv.Itoa(n))
			_, _ = w.Write(pattern(n, 7))
			return
		}
		_, _ = w.Write(body)
	}))
	cfg := proxyConfig(t, up.URL)
	cfg.Loops = 2
	cfg.Handler = serveWith(nil, func(w http.ResponseWriter, r *http.Request, forward func()) {
		if strings.HasPrefix(r.URL.Path, "/async") {
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		}
		if strings.HasSuffix(r.URL.Path, "/deny") {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, "no")
			return
		}
		forward()
	})
	cfg.Handler = onGoroutine(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/async") }, cfg.Handler)
	addr := startEngine(t, cfg)

	// request returns a random request and the body of its answer.
	request := func(rng *rand.Rand, k int) (req string, want []byte, deny bool) {
		path := "/sync"
		if rng.IntN(2) == 0 {
			path = "/async"
		}
		if deny = rng.IntN(5) == 0; deny {
			path += "/deny"
		}
		switch rng.IntN(3) {
		case 0:
			n := rng.IntN(300_000)
			req, want = fmt.Sprintf("GET %s?n=%d HTTP/1.1\r\nHost: x\r\n\r\n", path, n), pattern(n, 7)
		case 1:
			want = pattern(rng.IntN(100_000), byte(k))
			req = fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", path, len(want), want)
		default:
			want = pattern(rng.IntN(50_000), byte(k))
			var b strings.Builder
			fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", path)
			for rest := want; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(9000))
				fmt.Fprintf(&b, "%x\r\n%s\r\n", n, rest[:n])
				rest = rest[n:]
			}
			b.WriteString("0\r\n\r\n")
			req = b.String()
		}
		if deny {
			want = []byte("no")
		}
		return req, want, deny
	}

	const workers, conns = 12, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			leaves := i%2 == 0
			for range conns {
				c, err := net.DialTimeout("tcp", addr, ioTimeout)
				if err != nil {
					errs <- err
					return
				}
				_ = c.SetDeadline(time.Now().Add(ioTimeout))
				br := bufio.NewReader(c)
				for k := range 1 + rng.IntN(5) {
					req, want, deny := request(rng, k)
					if leaves {
						_, _ = io.WriteString(c, req[:rng.IntN(len(req)+1)])
						time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
						if rng.IntN(2) == 0 {
							_ = c.(*net.TCPConn).SetLinger(0)
						}
						break
					}
					go func() { _, _ = io.WriteString(c, req) }() // the answer may start first
					resp, err := http.ReadResponse(br, nil)
					var body []byte
					if err == nil {
						body, err = io.ReadAll(resp.Body)
					}
					if err != nil || !bytes.Equal(body, want) {
						c.Close()
						errs <- fmt.Errorf("worker %d: %.40q: %v, %s", i, req, err, firstDiff(body, want))
						return
					}
					if deny && resp.Close {
						break // the body was not read whole
					}
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestNewAndServe: what New refuses, Forward with a writer not the
// engine's, and a second Serve.
func TestNewAndServe(t *testing.T) {
	h := forwardAll(t)
	for _, cfg := range []eventloop.Config{
		{Handler: h},
		{Upstream: mustURL(t, "https://127.0.0.1:1"), Handler: h},
		{Upstream: mustURL(t, "http:///path"), Handler: h},
		{Upstream: mustURL(t, "http://127.0.0.1:1")},
	} {
		if _, err := eventloop.New(cfg); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}

	srv, err := eventloop.New(proxyConfig(t, "http://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := serveEngine(t, srv, ln)
	// An answer (502: nothing listens upstream) shows the first Serve runs.
	c, br := dial(t, e.addr)
	write(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background(), ln2); err == nil {
		t.Errorf("a second Serve returned nil")
	}
	if c, err := net.Dial("tcp", ln2.Addr().String()); err == nil {
		c.Close()
		t.Errorf("the second Serve's listener was left open")
	}
	e.cancel()
	if err := e.wait(t, ioTimeout); err != nil {
		t.Errorf("Serve: %v", err)
	}
}
