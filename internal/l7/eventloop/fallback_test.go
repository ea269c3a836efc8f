package eventloop_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
)

// An upstream name with several addresses (localhost as ::1 and
// 127.0.0.1, say) where only one listens: a refused connect moves on to the
// next address, for requests with and without a body; when every address
// refuses, the client gets the 502.
func TestDialFallsBackToTheNextAddress(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, r.Method+" "+string(b))
	}))
	t.Cleanup(up.Close)
	good := netip.MustParseAddrPort(strings.TrimPrefix(up.URL, "http://"))
	dead := refusingAddr(t)

	srv, err := eventloop.New(eventloop.Config{Upstream: mustURL(t, up.URL), Loops: 1,
		Handler: forwardAll(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveEngine(t, srv, ln).expectCleanEnd(t)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	call := func(method, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+ln.Addr().String()+"/x", strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := call("GET", ""); code != 200 { // Serve has resolved the upstream
		t.Fatalf("before: status %d", code)
	}

	eventloop.SetUpstreamAddrs(srv, []netip.AddrPort{dead, good})
	for range 3 {
		if code, body := call("GET", ""); code != 200 || body != "GET " {
			t.Errorf("GET with the first address refusing: %d %q", code, body)
		}
		if code, body := call("POST", "payload"); code != 200 || body != "POST payload" {
			t.Errorf("POST with the first address refusing: %d %q", code, body)
		}
		up.CloseClientConnections() // the pooled ones: the next requests dial again
	}

	eventloop.SetUpstreamAddrs(srv, []netip.AddrPort{dead, dead})
	up.CloseClientConnections()
	time.Sleep(50 * time.Millisecond) // let the loop see the pooled connections close
	if code, _ := call("GET", ""); code != http.StatusBadGateway {
		t.Errorf("every address refusing: status %d, want 502", code)
	}
}

// refusingAddr is a loopback address and port nothing listens on.
func refusingAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return a
}
