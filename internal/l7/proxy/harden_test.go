package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// spellingConfig limits /limited (any case) to one request per hour, and
// lets /open through without limits.
const spellingConfig = `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: ENGINE
  PATHS
  routes:
    - name: limited
      match: {path_prefix: /limited, path_case: insensitive}
      limits:
        - {name: one, key: global, rate: 1/h, burst: 1}
`

// issue29Spellings are the spellings of /limited/a the audit of issue 29
// sent past a one-request limit, with the status strict paths give them
// (429: normalised and limited; 400: refused).
var issue29Spellings = []struct {
	target string
	strict int
}{
	{"//limited/a", 429},
	{"/./limited/a", 429},
	{"/x/../limited/a", 429},
	{"/%2e/limited/a", 429},
	{"/x/%2e%2e/limited/a", 429},
	{"/%09/../limited", 400},
	{"/%2flimited/a", 400},
	{"/LIMITED/a", 429},
	{"/\\limited/a", 400},
	{"http://a//limited/a", 429},
	{"/limited%2Fa", 400},
	{"/%6Cimited/a", 429},
	{"/limited/a/", 429},
	{"/limited;x/a", 400},
}

// TestPathSpellingsShareTheLimit: under both engines and both path rules,
// once /limited/a took the one request, every other spelling of it is
// refused (429), or under strict paths refused as a bad request (400);
// none reaches the upstream.
func TestPathSpellingsShareTheLimit(t *testing.T) {
	up := startRecordingUpstream(t)
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		for _, mode := range []string{"standard", "strict"} {
			t.Run(string(e)+" "+mode, func(t *testing.T) {
				src := strings.ReplaceAll(spellingConfig, "ENGINE", string(e))
				src = strings.ReplaceAll(src, "PATHS", "paths: {normalize: "+mode+"}")
				_, base := startProxy(t, decodeYAML(t, src, up.srv.URL), Options{Clock: new(l7test.ManualClock)})
				addr := strings.TrimPrefix(base, "http://")
				get := func(target string) int {
					resp, _ := exchange(t, target, addr, http.MethodGet,
						[]byte("GET "+target+" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
					return resp.StatusCode
				}
				if s := get("/limited/a"); s != http.StatusOK {
					t.Fatalf("first /limited/a: %d", s)
				}
				mark := up.count()
				for _, c := range issue29Spellings {
					want := http.StatusTooManyRequests
					if mode == "strict" {
						want = c.strict
					}
					if got := get(c.target); got != want {
						t.Errorf("%s: %d, want %d", c.target, got, want)
					}
				}
				if seen := up.since(mark); len(seen) > 0 {
					t.Errorf("%d spellings reached the upstream, first %q", len(seen), seen[0].requestURI)
				}
			})
		}
	}
}

// TestPathForwardedNormalised: both engines forward the same normal form
// (internal/l7/target), or the target as sent with paths.forward: as-sent.
func TestPathForwardedNormalised(t *testing.T) {
	up := startRecordingUpstream(t)
	cases := []struct{ target, normal, asSent string }{
		{"/open/a", "/open/a", "/open/a"},
		{"//open/./x/../a%2e?q=%2e", "/open/a.?q=%2e", "//open/./x/../a%2e?q=%2e"},
		{"/open/caf\xc3\xa9", "/open/caf%C3%A9", "/open/caf\xc3\xa9"},
		{"/open/%7euser/%3b", "/open/~user/%3B", "/open/%7euser/%3b"},
		{"http://a/open/x/..", "/open/", "/open/x/.."},
		{"/open/LIMITED", "/open/LIMITED", "/open/LIMITED"},
	}
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		for _, fwd := range []string{"normalized", "as-sent"} {
			t.Run(string(e)+" "+fwd, func(t *testing.T) {
				src := strings.ReplaceAll(spellingConfig, "ENGINE", string(e))
				src = strings.ReplaceAll(src, "PATHS", "paths: {forward: "+fwd+"}")
				_, base := startProxy(t, decodeYAML(t, src, up.srv.URL), Options{Clock: new(l7test.ManualClock)})
				addr := strings.TrimPrefix(base, "http://")
				for _, c := range cases {
					mark := up.count()
					resp, _ := exchange(t, c.target, addr, http.MethodGet,
						[]byte("GET "+c.target+" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
					want := c.normal
					if fwd == "as-sent" {
						want = c.asSent
						if e == EngineNetHTTP && strings.Contains(c.target, "\xc3") {
							want = c.normal // net/url encodes raw UTF-8 (docs/l7-proxy.md)
						}
					}
					seen := up.since(mark)
					if resp.StatusCode != http.StatusOK || len(seen) != 1 || seen[0].requestURI != want {
						t.Errorf("%q: status %d, upstream saw %v, want %q", c.target, resp.StatusCode, seen, want)
					}
				}
			})
		}
	}
}

// TestAsteriskTargets: OPTIONS * is answered by the proxy (200, never
// forwarded) under both engines; any other method with "*" is 400.
func TestAsteriskTargets(t *testing.T) {
	up := startRecordingUpstream(t)
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			src := strings.ReplaceAll(strings.ReplaceAll(spellingConfig, "ENGINE", string(e)), "PATHS", "")
			_, base := startProxy(t, decodeYAML(t, src, up.srv.URL), Options{Clock: new(l7test.ManualClock)})
			addr := strings.TrimPrefix(base, "http://")
			mark := up.count()
			for method, want := range map[string]int{http.MethodOptions: 200, http.MethodGet: 400, http.MethodDelete: 400} {
				resp, _ := exchange(t, method, addr, method, []byte(method+" * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
				if resp.StatusCode != want {
					t.Errorf("%s *: %d, want %d", method, resp.StatusCode, want)
				}
			}
			if seen := up.since(mark); len(seen) > 0 {
				t.Errorf("forwarded: %v", seen)
			}
		})
	}
}

// issue29Identity are the client-set identity fields the audit of issue 29
// saw reach the upstream.
var issue29Identity = []string{"X-Real-IP", "True-Client-IP", "CF-Connecting-IP", "X-Client-IP",
	"X-Cluster-Client-IP", "Forwarded-For", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server",
	"X-Original-URL", "X-Rewrite-URL", "X_Forwarded_For", "x_real_ip"}

// TestIdentityFieldsRemoved: under both engines the default identity
// fields and any field with an underscore in its name are removed, other
// fields pass; a policy's own list replaces the default one.
func TestIdentityFieldsRemoved(t *testing.T) {
	up := startRecordingUpstream(t)
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		for _, list := range []string{"", "identity_fields: [X-Custom-Ip]"} {
			t.Run(string(e)+" "+list, func(t *testing.T) {
				src := strings.ReplaceAll(strings.ReplaceAll(spellingConfig, "ENGINE", string(e)), "PATHS", list)
				_, base := startProxy(t, decodeYAML(t, src, up.srv.URL), Options{Clock: new(l7test.ManualClock)})
				addr := strings.TrimPrefix(base, "http://")
				raw := "GET /open HTTP/1.1\r\nHost: a\r\nConnection: close\r\nX-Keep: 1\r\nX-Custom-Ip: 203.0.113.9\r\n"
				for _, name := range issue29Identity {
					raw += name + ": 203.0.113.9\r\n"
				}
				mark := up.count()
				exchange(t, "identity", addr, http.MethodGet, []byte(raw+"\r\n"))
				seen := up.since(mark)
				if len(seen) != 1 {
					t.Fatalf("upstream saw %d requests", len(seen))
				}
				h := seen[0].header
				if h.Get("X-Keep") != "1" || h.Get("X-Forwarded-For") != "127.0.0.1" {
					t.Errorf("X-Keep %q, X-Forwarded-For %q", h.Get("X-Keep"), h.Get("X-Forwarded-For"))
				}
				for name := range h {
					if strings.Contains(name, "_") {
						t.Errorf("%s reached the upstream", name)
					}
				}
				for _, name := range issue29Identity {
					_, got := h[http.CanonicalHeaderKey(name)]
					if want := list != "" && !strings.Contains(name, "_"); got != want {
						t.Errorf("%s at the upstream: %v, want %v", name, got, want)
					}
				}
				if _, got := h["X-Custom-Ip"]; got == (list != "") {
					t.Errorf("X-Custom-Ip at the upstream: %v", got)
				}
			})
		}
	}
}

// TestHeadBounds: both engines answer 431 to a head over 64 KiB or with
// more than 128 fields, and forward one just under both bounds.
func TestHeadBounds(t *testing.T) {
	up := startRecordingUpstream(t)
	fields := func(n, size int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("X-F" + strconv.Itoa(i) + ": " + strings.Repeat("v", size) + "\r\n")
		}
		return b.String()
	}
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			src := strings.ReplaceAll(strings.ReplaceAll(spellingConfig, "ENGINE", string(e)), "PATHS", "")
			_, base := startProxy(t, decodeYAML(t, src, up.srv.URL), Options{Clock: new(l7test.ManualClock)})
			addr := strings.TrimPrefix(base, "http://")
			for _, c := range []struct {
				name   string
				fields string
				want   int
			}{
				{"127 fields", fields(126, 10), 200}, // and Host
				{"129 fields", fields(128, 10), 431},
				{"62 KiB", fields(31, 2000), 200},
				{"66 KiB", fields(33, 2000), 431},
				{"900 KiB", fields(90, 10000), 431},
			} {
				resp, err := tryExchangeHead(addr, "GET /open HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"+c.fields+"\r\n")
				if err != nil || resp != c.want {
					t.Errorf("%s: %d, %v; want %d", c.name, resp, err, c.want)
				}
			}
		})
	}
}

// tryExchangeHead sends a request head and returns the response status.
// The proxy may answer and close before it read the whole head.
func tryExchangeHead(addr, head string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() { _, _ = c.Write([]byte(head)) }()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// transferUpstream reads request bodies (errors ignored: these tests cut
// them) and answers /big with 64 MiB, reporting on ended whether it could
// write them all.
func transferUpstream(t *testing.T) (url string, ended chan error) {
	ended = make(chan error, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/big" {
			_, _ = io.WriteString(w, "ok\n")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(64<<20))
		chunk := make([]byte, 64<<10)
		for range 1024 {
			if _, err := w.Write(chunk); err != nil {
				ended <- err
				return
			}
		}
		ended <- nil
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ended
}

// TestTransferRules: under both engines a trickled request body is
// answered 408 and closed (issue 29: one byte per 2s, Content-Length
// 1,000,000; here one byte per 200ms against 1000 B/s over 1s periods), a
// malformed chunk is 400 and closed, and a client that stops reading a
// 64 MiB response is cut off together with its upstream exchange.
func TestTransferRules(t *testing.T) {
	upURL, ended := transferUpstream(t)
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			src := strings.ReplaceAll(strings.ReplaceAll(spellingConfig, "ENGINE", string(e)), "PATHS",
				"timeouts: {body: 1s, response: 1s, min_rate: 1000}")
			_, base := startProxy(t, decodeYAML(t, src, upURL), Options{Clock: new(l7test.ManualClock)})
			addr := strings.TrimPrefix(base, "http://")

			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = io.WriteString(c, "POST /open HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n")
			stop := l7test.Trickle(c, 200*time.Millisecond)
			start := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			got, err := io.ReadAll(c)
			stop()
			if !strings.HasPrefix(string(got), "HTTP/1.1 408 ") || err != nil && !strings.Contains(err.Error(), "reset") {
				t.Errorf("trickled body: %q, %v", got, err)
			}
			if d := time.Since(start); d < time.Second {
				t.Errorf("trickled body cut after %v, within its first period", d)
			}

			status, err := tryExchangeHead(addr, "POST /open HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
			if err != nil || status != http.StatusBadRequest {
				t.Errorf("malformed chunk: %d, %v", status, err)
			}

			c2, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			_, _ = io.WriteString(c2, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
			select {
			case err := <-ended:
				if err == nil {
					t.Fatal("the upstream wrote all 64 MiB to a client that reads nothing")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the upstream exchange is still held after 30s (response period 1s)")
			}
		})
	}
}

// TestTunnelRules: under both engines a 101 to another protocol than the
// one asked for is 502 (issue 29: h2c asked, websocket answered), and a
// tunnel silent for tunnel_idle is closed on both sides.
func TestTunnelRules(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	upEnds := make(chan struct{}, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				if req.Header.Get("Upgrade") != "websocket" {
					time.Sleep(2 * time.Second)
					return
				}
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						upEnds <- struct{}{}
						return
					}
					_, _ = io.WriteString(c, line)
				}
			}()
		}
	}()
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			src := strings.ReplaceAll(strings.ReplaceAll(spellingConfig, "ENGINE", string(e)), "PATHS",
				"timeouts: {tunnel_idle: 1s}")
			_, base := startProxy(t, decodeYAML(t, src, "http://"+ln.Addr().String()), Options{Clock: new(l7test.ManualClock)})
			addr := strings.TrimPrefix(base, "http://")
			status, err := tryExchangeHead(addr, "GET /open HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"+
				"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
			if err != nil || status != http.StatusBadGateway {
				t.Errorf("h2c asked, websocket answered: %d, %v", status, err)
			}

			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v, %v", resp, err)
			}
			_, _ = io.WriteString(c, "ping\n")
			if line, err := br.ReadString('\n'); line != "ping\n" {
				t.Fatalf("echo %q: %v", line, err)
			}
			start := time.Now()
			if rest, err := io.ReadAll(br); err != nil && !strings.Contains(err.Error(), "reset") || len(rest) > 0 {
				t.Errorf("silent tunnel: read %q, %v", rest, err)
			}
			if d := time.Since(start); d < time.Second {
				t.Errorf("tunnel closed after %v of silence, before tunnel_idle", d)
			}
			select {
			case <-upEnds:
			case <-time.After(10 * time.Second):
				t.Error("the upstream side of the tunnel stayed open")
			}
		})
	}
}

// TestIdleConnectionKeepsNoWriteDeadline: under net-http, a kept-alive
// connection idle past its last response's period still gets net/http's
// own answers (here 431 for a head over 64 KiB), not a close from the
// write deadline the response's period left (net/http drops it when the
// connection goes idle, as of Go 1.26; this holds us to that).
func TestIdleConnectionKeepsNoWriteDeadline(t *testing.T) {
	up := startRecordingUpstream(t)
	src := strings.ReplaceAll(strings.ReplaceAll(spellingConfig, "ENGINE", "net-http"), "PATHS",
		"timeouts: {response: 300ms}")
	_, base := startProxy(t, decodeYAML(t, src, up.srv.URL), Options{Clock: new(l7test.ManualClock)})
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "GET /open HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	time.Sleep(time.Second)
	go func() {
		_, _ = io.WriteString(c, "GET /open HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("v", 70<<10)+"\r\n\r\n")
	}()
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("after an idle second: %v %v, want 431", resp, err)
	}
}
