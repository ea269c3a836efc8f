package netns_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestL7StageEngineThroughDaemon: `edgectl run` serves the L7 stage with
// the engine its policy names, says which in /metrics, and the wire shows
// it: the event loop relays a response's field names as the upstream sent
// them, net/http's ReverseProxy canonicalises them. A reload to the other
// engine keeps the address and switches; a reload whose l7.listen port is
// taken is refused before anything changes (generation, engine, address).
func TestL7StageEngineThroughDaemon(t *testing.T) {
	h := newL7Daemon(t, 9201, 8081, func(w http.ResponseWriter, r *http.Request) {
		w.Header()["x-raw-case"] = []string{"1"}
		io.WriteString(w, "ok")
	})
	s, c, proxyAddr := h.star, h.client, h.proxy
	section := func(listen netip.AddrPort, engine string) string {
		return l7Limited(listen, h.upstream, "engine: "+engine)
	}
	// get sends a request from the client namespace on a new connection
	// and returns the response head as received.
	get := func(path string) (string, int) {
		t.Helper()
		conn := h.dial()
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n", path)
		br := bufio.NewReader(conn)
		var head strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("read the response head: %v (%q)", err, head.String())
			}
			head.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head.String())), nil)
		if err != nil {
			t.Fatal(err)
		}
		return head.String(), resp.StatusCode
	}
	engineInfo := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, m := range h.scrape()["edgeguard_l7_stage_info"].GetMetric() {
			var engine, addr string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "engine":
					engine = l.GetValue()
				case "addr":
					addr = l.GetValue()
				}
			}
			out[addr] = engine
		}
		return out
	}

	h.run(section(proxyAddr, "event-loop"))

	head, code := get("/x")
	if code != 200 || !strings.Contains(head, "\r\nx-raw-case: 1\r\n") {
		t.Fatalf("event-loop: status %d, head not relayed as sent:\n%s", code, head)
	}
	if got := engineInfo(); got[proxyAddr.String()] != "event-loop" || len(got) != 1 {
		t.Fatalf("edgeguard_l7_stage_info: %v, want event-loop on %s", got, proxyAddr)
	}
	if l7 := h.status().L7; l7 == nil || l7.Engine != "event-loop" {
		t.Fatalf("status l7: %+v, want the event loop", l7)
	}
	if _, code := get("/limited"); code != 200 {
		t.Fatalf("first /limited: %d", code)
	}
	if _, code := get("/limited"); code != 429 {
		t.Fatalf("second /limited: %d, want 429", code)
	}
	// edgectl stats carries the L7 requests by route and decision.
	stats := h.stats()
	if len(stats.L7) == 0 || stats.L7[0].Route != "api" || stats.L7[0].Allowed != 1 || stats.L7[0].Limited != 1 {
		t.Fatalf("stats l7: %+v, want api with 1 allowed and 1 limited", stats.L7)
	}

	h.reload(section(proxyAddr, "net-http"))
	head, code = get("/x")
	if code != 200 || !strings.Contains(head, "\r\nX-Raw-Case: 1\r\n") {
		t.Fatalf("net-http after the reload: status %d, head:\n%s", code, head)
	}
	if got := engineInfo(); got[proxyAddr.String()] != "net-http" || len(got) != 1 {
		t.Fatalf("edgeguard_l7_stage_info after the reload: %v, want net-http on %s", got, proxyAddr)
	}

	// A port someone else holds: the reload fails before anything changes.
	taken := netip.AddrPortFrom(c.EdgeAddr4, 8082)
	var takenLn net.Listener
	if err := s.Edge.Do(func() (err error) {
		takenLn, err = net.Listen("tcp", taken.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer takenLn.Close()
	before := h.status()
	gen := before.Generation
	h.write(section(taken, "event-loop"))
	deadline := time.Now().Add(15 * time.Second)
	for st := h.status(); st.LastReload.OK || !st.LastReload.Time.After(before.LastReload.Time); st = h.status() {
		if time.Now().After(deadline) {
			t.Fatalf("the policy on a taken port was not refused within 15s\n%s", h.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := h.status()
	if st.LastReload.OK || !strings.Contains(st.LastReload.Error, "address already in use") {
		t.Fatalf("last reload %+v, want a failure naming the taken address", st.LastReload)
	}
	if st.Generation != gen {
		t.Fatalf("generation %d after the refused policy, want %d (unchanged)", st.Generation, gen)
	}
	head, code = get("/x")
	if code != 200 || !strings.Contains(head, "\r\nX-Raw-Case: 1\r\n") {
		t.Fatalf("after the refused policy: status %d, head:\n%s", code, head)
	}
	if got := engineInfo(); got[proxyAddr.String()] != "net-http" || len(got) != 1 {
		t.Fatalf("edgeguard_l7_stage_info after the refused policy: %v", got)
	}
	if l7 := st.L7; l7 == nil || l7.Engine != "net-http" || l7.Listen != proxyAddr.String() || len(l7.Routes) != 1 {
		t.Fatalf("status l7 after the refused policy: %+v", st.L7)
	}
}
