package eventloop_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUpgradeOnlyAsAsked: a 101 switching to another protocol than the one
// the client asked for is 502, never a tunnel (issue 29: h2c asked,
// websocket answered), as under httputil.ReverseProxy.
func TestUpgradeOnlyAsAsked(t *testing.T) {
	up := startRawUpstream(t, func(c net.Conn) {
		if _, err := readHead(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello\n")
		time.Sleep(time.Second)
	})
	addr := startEngine(t, proxyConfig(t, up.url()))
	c, br := dial(t, addr)
	write(t, c, "GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
	if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
}

// TestTunnelIdleTimeout: a tunnel that carries nothing either way for
// TunnelIdleTimeout is closed, both sides; one that keeps talking is not.
func TestTunnelIdleTimeout(t *testing.T) {
	ends := make(chan struct{}, 2)
	up := startRawUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readHead(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				ends <- struct{}{}
				return
			}
			_, _ = io.WriteString(c, line)
		}
	})
	cfg := proxyConfig(t, up.url())
	cfg.TunnelIdleTimeout = 1500 * time.Millisecond
	addr := startEngine(t, cfg)
	c, br := dial(t, addr)
	write(t, c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if head, err := readHead(br); err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
		t.Fatalf("head %q: %v", head, err)
	}
	// Talking every 500ms for 3s (twice the timeout) keeps it open.
	for range 6 {
		time.Sleep(500 * time.Millisecond)
		write(t, c, "ping\n")
		if got, err := br.ReadString('\n'); got != "ping\n" {
			t.Fatalf("echo %q: %v", got, err)
		}
	}
	// Silence: closed after the timeout (checked once a second), not
	// before 1.5s; the bound allows a loaded machine.
	start := time.Now()
	expectClosedWithin(t, c, br, 10*time.Second)
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Errorf("closed after %v, before the idle timeout", d)
	}
	select {
	case <-ends:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream side of the tunnel stayed open")
	}
}

// TestExpectationFailed: an Expect other than 100-continue is 417 and never
// forwarded, as under net/http's server; 100-continue goes on.
func TestExpectationFailed(t *testing.T) {
	up, seen := recordingUpstream(t, func(w http.ResponseWriter, _ *http.Request, body []byte) { _, _ = w.Write(body) })
	addr := startEngine(t, proxyConfig(t, up.URL))
	c, br := dial(t, addr)
	write(t, c, "GET /x HTTP/1.1\r\nHost: x\r\nExpect: foo\r\n\r\n")
	if resp := readResponse(t, br, http.MethodGet); resp.StatusCode != http.StatusExpectationFailed {
		t.Fatalf("status %d, want 417", resp.StatusCode)
	}
	select {
	case s := <-seen:
		t.Fatalf("forwarded: %v", s)
	case <-time.After(100 * time.Millisecond):
	}
}
