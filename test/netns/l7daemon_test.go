package netns_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/test/netns"
)

// l7PolicyHead is the XDP half of the L7 daemon tests' policies (the
// client's link); the test's l7: section follows it.
var l7PolicyHead = xdpHead(100000, "  - {name: eg-c0, xdp_mode: native}")

// l7Limited is an l7: section on listen in front of upstream whose route
// api (/limited) admits one request an hour per client; key is one more
// l7 setting ("engine: net-http", "access_log: /path").
func l7Limited(listen netip.AddrPort, upstream net.Addr, key string) string {
	return fmt.Sprintf(`l7:
  listen: %s
  upstream: http://%s
  %s
  routes:
    - name: api
      match: {path_prefix: /limited}
      limits:
        - {name: per-ip, key: ip, rate: 1/h, burst: 1}
`, listen, upstream, key)
}

// l7Daemon is the set-up the L7 tests through the real daemon share: a
// star with one client, an upstream HTTP server in the edge namespace on
// the client's edge address (none for a test of the rate-limit service
// alone), and `edgectl run` in the edge namespace (daemonHarness) with
// l7PolicyHead and the test's l7: section. Everything is removed when the
// test ends, also when it fails: the daemon is stopped with SIGTERM and
// its exit checked (killed if it does not stop), its pins removed, the
// upstream closed, the namespaces and links deleted.
type l7Daemon struct {
	*daemonHarness
	star   *netns.Star
	client *netns.Client
	// upstream is the upstream server's address (nil without one).
	upstream net.Addr
	// proxy is where the test's l7.listen points: the client's edge
	// address and the port it chose.
	proxy netip.AddrPort
}

// newL7Daemon builds the namespaces and the upstream (handler on
// upstreamPort; none when handler is nil); run starts the daemon.
func newL7Daemon(t *testing.T, upstreamPort, proxyPort uint16, handler http.HandlerFunc) *l7Daemon {
	t.Helper()
	s := netns.New(t).Star(1)
	c := s.Clients[0]
	d := &l7Daemon{daemonHarness: newDaemonHarness(t, s.Edge), star: s, client: c,
		proxy: netip.AddrPortFrom(c.EdgeAddr4, proxyPort)}
	if handler != nil {
		d.upstream = serveHTTP(t, s.Edge, netip.AddrPortFrom(c.EdgeAddr4, upstreamPort), handler)
	}
	return d
}

// write replaces the policy file with l7PolicyHead and section
// (writeConfig).
func (d *l7Daemon) write(section string) {
	d.t.Helper()
	d.writeConfig(l7PolicyHead + section)
}

// run writes the policy and starts the daemon (Start returns once it
// answers on its socket); it is stopped when the test ends.
func (d *l7Daemon) run(section string) {
	d.t.Helper()
	d.write(section)
	d.start()
	d.t.Cleanup(func() { d.stop(syscall.SIGTERM) })
}

// reload writes the policy and waits until the daemon has applied it (its
// generation moved on).
func (d *l7Daemon) reload(section string) {
	d.t.Helper()
	gen := d.status().Generation
	d.write(section)
	waitGeneration(d.t, d.daemonHarness, gen+1)
}

// dial opens a TCP connection to the L7 stage from the client's main
// address, inside the client namespace; the caller closes it.
func (d *l7Daemon) dial() net.Conn {
	d.t.Helper()
	var conn net.Conn
	if err := d.client.NS.Do(func() (err error) {
		nd := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(d.client.Src4, 0))}
		conn, err = nd.Dial("tcp", d.proxy.String())
		return err
	}); err != nil {
		d.t.Fatalf("dial the l7 stage: %v\n%s", err, d.Logs())
	}
	return conn
}

// httpClient is an HTTP client in the client namespace, from its main
// address, one connection per request.
func (d *l7Daemon) httpClient(dial, timeout time.Duration) *http.Client {
	return &http.Client{Transport: nsTransport(d.client.NS, d.client.Src4, dial), Timeout: timeout}
}

// waitDenied waits (up to 10s) until the daemon's deny list holds p with
// origin and returns the entry.
func (d *l7Daemon) waitDenied(p netip.Prefix, origin string) control.ListEntry {
	d.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := d.ctl("deny", "list", "--json")
		if err != nil {
			d.t.Fatal(err)
		}
		var entries []control.ListEntry
		if err := json.Unmarshal([]byte(out), &entries); err != nil {
			d.t.Fatal(err)
		}
		for _, e := range entries {
			if e.Prefix == p && e.Origin == origin {
				return e
			}
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s not on the deny list with origin %s after 10s: %+v\n%s", p, origin, entries, d.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// statusCounts sends n GETs of url with client and counts the answers by
// status; -1 counts requests that got no answer (once a source is
// escalated, its SYN is dropped at the NIC).
func statusCounts(client *http.Client, url string, n int) map[int]int {
	codes := map[int]int{}
	for range n {
		resp, err := client.Get(url)
		if err != nil {
			codes[-1]++
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	return codes
}
