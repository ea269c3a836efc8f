package netns_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// l7HardenL7 is the L7 stage with short timeouts on an engine; /limited
// admits one request an hour in all.
const l7HardenL7 = `l7:
  listen: %s
  upstream: http://%s
  engine: %s
  timeouts: {body: 1s, response: 1s, min_rate: 1000, tunnel_idle: 1s}
  routes:
    - name: limited
      match: {path_prefix: /limited, path_case: insensitive}
      limits:
        - {name: one, key: global, rate: 1/h, burst: 1}
`

// TestL7Issue29ThroughDaemon: the vectors of issue 29, raw bytes from a
// client namespace to `edgectl run --log-format json` serving each engine
// in turn: every spelling of /limited/a meets its one-request limit, the
// client's identity fields do not reach the upstream, OPTIONS *, GET *,
// Expect: foo and a 101 to an upgrade nobody asked for get one answer
// under both engines, a trickled body is cut (408) within a few of its 1s
// periods, a client that reads nothing of 64 MiB is cut with its upstream
// exchange, 100 connections sending 900 KB heads each get 431 without the
// daemon's RSS growing by more than 64 MB, and every line the daemon
// logged is JSON. About 15s.
func TestL7Issue29ThroughDaemon(t *testing.T) {
	bigEnded := make(chan error, 2)
	var mu sync.Mutex
	var seen []*http.Request
	h := newL7Daemon(t, 9203, 8083, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Length", fmt.Sprint(64<<20))
			chunk := make([]byte, 64<<10)
			for range 1024 {
				if _, err := w.Write(chunk); err != nil {
					bigEnded <- err
					return
				}
			}
			bigEnded <- nil
			return
		}
		if r.Header.Get("Upgrade") != "" {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "websocket")
			w.WriteHeader(http.StatusSwitchingProtocols)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	h.Args = append(h.Args, "--log-format", "json")
	c, proxyAddr := h.client, h.proxy
	upstreamSaw := func() []*http.Request {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
	// send writes raw bytes from the client namespace and returns the
	// status line's code (0: closed without an answer) and how long it
	// took; trickle, when set, is written a byte at a time every 200ms.
	send := func(raw string, trickle bool) (int, time.Duration) {
		t.Helper()
		conn := h.dial()
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		start := time.Now()
		_, _ = io.WriteString(conn, raw)
		if trickle {
			go func() {
				for range 100 {
					time.Sleep(200 * time.Millisecond)
					if _, err := conn.Write([]byte("x")); err != nil {
						return
					}
				}
			}()
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return 0, time.Since(start)
		}
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	get := func(target string, fields ...string) int {
		code, _ := send("GET "+target+" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"+strings.Join(fields, "")+"\r\n", false)
		return code
	}
	section := func(engine string) string { return fmt.Sprintf(l7HardenL7, h.proxy, h.upstream, engine) }

	h.run(section("event-loop"))
	for i, engine := range []string{"event-loop", "net-http"} {
		if i > 0 {
			h.reload(section(engine)) // a new proxy: the limit starts over
		}
		if code := get("/limited/a"); code != 200 {
			t.Fatalf("%s: first /limited/a: %d\n%s", engine, code, h.Logs())
		}
		upstreamSaw()
		for _, target := range []string{"//limited/a", "/./limited/a", "/x/../limited/a", "/%2e/limited/a",
			"/x/%2e%2e/limited/a", "/%09/../limited", "/%2flimited/a", "/LIMITED/a", "/\\limited/a",
			"http://a//limited/a"} {
			if code := get(target); code != 429 {
				t.Errorf("%s: %s: %d, want 429", engine, target, code)
			}
		}
		if got := upstreamSaw(); len(got) > 0 {
			t.Errorf("%s: %d spellings reached the upstream, first %q", engine, len(got), got[0].RequestURI)
		}

		if code := get("/open", "X-Real-IP: 203.0.113.9\r\n", "True-Client-IP: 203.0.113.9\r\n",
			"X_Forwarded_For: 203.0.113.9\r\n", "X-Original-URL: /admin\r\n", "X-Keep: 1\r\n"); code != 200 {
			t.Errorf("%s: /open with identity fields: %d", engine, code)
		}
		if got := upstreamSaw(); len(got) != 1 || got[0].Header.Get("X-Keep") != "1" ||
			got[0].Header.Get("X-Real-Ip") != "" || got[0].Header.Get("True-Client-Ip") != "" ||
			got[0].Header.Get("X-Original-Url") != "" || got[0].Header.Get("X_forwarded_for") != "" {
			t.Errorf("%s: the upstream saw %v", engine, got)
		}

		for _, v := range []struct {
			raw  string
			want int
		}{
			{"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 200},
			{"GET * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 400},
			{"GET /open HTTP/1.1\r\nHost: a\r\nExpect: foo\r\nConnection: close\r\n\r\n", 417},
			{"GET /open HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", 502},
		} {
			if code, _ := send(v.raw, false); code != v.want {
				t.Errorf("%s: %q: %d, want %d", engine, strings.SplitN(v.raw, "\r\n", 2)[0], code, v.want)
			}
		}
		code, took := send("POST /open HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n", true)
		if code != 408 || took < time.Second {
			t.Errorf("%s: trickled body: %d after %v, want 408 after at least one 1s period", engine, code, took)
		}
		t.Logf("%s: trickled body answered %d after %v (periods of 1s, checked once a second)", engine, code, took)

		// A client that reads nothing of a 64 MiB response: its upstream
		// exchange is cut within a few 1s periods.
		var conn net.Conn
		if err := c.NS.Do(func() (err error) {
			conn, err = net.Dial("tcp", proxyAddr.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, _ = io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
		select {
		case err := <-bigEnded:
			if err == nil {
				t.Errorf("%s: the upstream wrote all 64 MiB to a client that reads nothing", engine)
			}
			t.Logf("%s: the upstream exchange of a client that reads nothing ended after %v", engine, time.Since(start))
		case <-time.After(30 * time.Second):
			t.Errorf("%s: the upstream exchange of a client that reads nothing is held after 30s", engine)
		}
		conn.Close()

		// 100 connections each sending a 900 KB head (issue 29: net-http
		// held them, RSS 60 -> 339 MB): each is 431 at 64 KiB, and the
		// daemon's RSS grows by far less than the heads sent.
		before := daemonRSS(t, h.Socket)
		var wg sync.WaitGroup
		var answered431 sync.Map
		for i := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var conn net.Conn
				if err := c.NS.Do(func() (err error) {
					conn, err = net.Dial("tcp", proxyAddr.String())
					return err
				}); err != nil {
					return
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(20 * time.Second))
				go func() {
					_, _ = io.WriteString(conn, "GET /open HTTP/1.1\r\nHost: a\r\nX-Big: ")
					chunk := strings.Repeat("v", 64<<10)
					for range 14 {
						if _, err := io.WriteString(conn, chunk); err != nil {
							return
						}
					}
				}()
				if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil && resp.StatusCode == 431 {
					answered431.Store(i, true)
				}
			}()
		}
		wg.Wait()
		n := 0
		answered431.Range(func(any, any) bool { n++; return true })
		after := daemonRSS(t, h.Socket)
		t.Logf("%s: %d of 100 900 KB heads answered 431; daemon RSS %d -> %d MB", engine, n, before>>20, after>>20)
		if n != 100 || after-before > 64<<20 {
			t.Errorf("%s: %d of 100 large heads answered 431, RSS grew by %d MB (want 100 and < 64 MB)", engine, n, (after-before)>>20)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(h.Logs()), "\n") {
		if line != "" && !json.Valid([]byte(line)) {
			t.Errorf("a log line that is not JSON: %q", line)
		}
	}
}

// daemonRSS is the resident set of the test's daemon, in bytes.
func daemonRSS(t *testing.T, socket string) int64 {
	t.Helper()
	pid, err := daemonPID(socket)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
