package netns_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/test/netns"
)

const escalationPolicy = `apiVersion: edgeguard/v1
interfaces:
  - {name: eg-c0, xdp_mode: native}
defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    packets: {rate: 100000/s, burst: 100000}
  per_prefix: {}
  per_asn: {}
metrics:
  listen: 127.0.0.1:19469
l7:
  listen: %s
  upstream: http://%s
  escalation: {enabled: true, rejections: 3, window: 1m, ttl: 10m}
  routes:
    - name: api
      match: {path_prefix: /}
      limits:
        - {name: per-ip, key: ip, rate: 2/min, burst: 2}
`

// TestL7EscalationToNIC: a client that keeps getting 429s from the L7
// stage is put on the XDP deny list (origin l7) by the daemon, so its
// packets, HTTP or not, are dropped at the NIC from then on.
func TestL7EscalationToNIC(t *testing.T) {
	s := netns.New(t).Star(1)
	c := s.Clients[0]
	h := newDaemonHarness(t, s.Edge)

	// The upstream: a plain HTTP server inside the edge namespace.
	upAddr := serveHTTP(t, s.Edge, netip.AddrPortFrom(c.EdgeAddr4, 9200), func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

	proxyAddr := netip.AddrPortFrom(c.EdgeAddr4, 8080)
	if err := os.WriteFile(h.Config, []byte(fmt.Sprintf(escalationPolicy, proxyAddr, upAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	h.start()
	defer h.stop(syscall.SIGTERM)

	// An HTTP client in the client namespace, from its main address.
	tr := nsTransport(c.NS, c.Src4, 2*time.Second)
	client := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	codes := map[int]int{}
	for i := 0; i < 6; i++ {
		resp, err := client.Get("http://" + proxyAddr.String() + "/v1/thing")
		if err != nil {
			// Once escalated, the SYN itself is dropped at the NIC.
			codes[-1]++
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[200] != 2 || codes[429] < 3 {
		t.Fatalf("responses by status: %v; want 2×200 then 429s", codes)
	}

	// The daemon lists the source with origin l7, within a few seconds.
	want := netip.PrefixFrom(c.Src4, 32)
	deadline := time.Now().Add(10 * time.Second)
	var entries []control.ListEntry
	for {
		out, err := h.ctl("deny", "list", "--json")
		if err != nil {
			t.Fatal(err)
		}
		entries = nil
		if err := json.Unmarshal([]byte(out), &entries); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range entries {
			if e.Prefix == want && e.Origin == "l7" && e.Expires != nil {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not on the deny list with origin l7 after 10s: %+v\n%s", want, entries, h.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Now the NIC drops the source: UDP from it never arrives, while its
	// second address (not escalated) still gets through.
	f := openDaemonFlow(t, s, 0)
	if got := f.burst(t, 100); got != 0 {
		t.Errorf("escalated source: %d of 100 packets got through the NIC", got)
	}
	if _, err := client.Get("http://" + proxyAddr.String() + "/v1/thing"); err == nil || !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "deadline") {
		t.Errorf("HTTP from the escalated source: err %v, want a timeout (SYN dropped at the NIC)", err)
	}
}
