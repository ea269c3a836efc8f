package netns_test

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// escalationL7 is an L7 stage that allows 2 requests a minute per client
// and sends a client to the deny list after 3 rejections (the fleet's
// lists test runs it on host a too).
const escalationL7 = `l7:
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
	// The upstream: a plain HTTP server inside the edge namespace.
	h := newL7Daemon(t, 9200, 8080, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	s, proxyAddr := h.star, h.proxy
	h.run(fmt.Sprintf(escalationL7, proxyAddr, h.upstream))

	// An HTTP client in the client namespace, from its main address.
	client := h.httpClient(2*time.Second, 3*time.Second)
	if codes := statusCounts(client, "http://"+proxyAddr.String()+"/v1/thing", 6); codes[200] != 2 || codes[429] < 3 {
		t.Fatalf("responses by status: %v; want 2×200 then 429s", codes)
	}

	// The daemon lists the source with origin l7, within a few seconds.
	if e := h.waitDenied(netip.PrefixFrom(h.client.Src4, 32), "l7"); e.Expires == nil {
		t.Fatalf("the escalation has no expiry: %+v", e)
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
