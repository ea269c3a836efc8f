package netns_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsDaemonL7 is an l7: section with only the rate-limit service, on TCP
// and a Unix socket: 2 requests an hour per remote_address under a limit
// named by the test, escalation after 3 refusals.
const rlsDaemonL7 = `l7:
  escalation: {enabled: true, rejections: 3, window: 1m, ttl: 10m}
  rls:
    listen: %s
    unix: %s
    rules:
      - name: per-ip
        domain: edge
        descriptor: [remote_address]
        limits:
          - {name: %s, rate: 2/h, algorithm: fixed-window}
`

// TestRLSThroughDaemon: `edgectl run` with an l7: section holding only the
// rate-limit service serves Envoy's RLS v3 on TCP (asked from the client
// namespace with Envoy's generated client) and on a Unix socket; edgectl
// status and l7 explain show it; a reload swaps the limits on the same
// listeners; a source the service keeps refusing is put on the XDP deny
// list (origin l7).
func TestRLSThroughDaemon(t *testing.T) {
	h := newL7Daemon(t, 0, 8091, nil)
	c, addr := h.client, h.proxy
	sock := filepath.Join(t.TempDir(), "rls.sock")
	section := func(limit string) string { return fmt.Sprintf(rlsDaemonL7, addr, sock, limit) }
	h.run(section("gen-a"))

	tcp, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			var conn net.Conn
			err := c.NS.Do(func() (err error) {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(c.Src4, 0))}
				conn, err = d.DialContext(ctx, "tcp", a)
				return err
			})
			return conn, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	unix, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close()
	ask := func(cc *grpc.ClientConn, src string) *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: src}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v\n%s", err, h.Logs())
		}
		return res
	}

	if st := h.status(); st.L7 == nil || st.L7.RLS["grpc"] != addr.String() || st.L7.RLS["unix"] != sock || st.L7.Engine != "" {
		t.Fatalf("status l7: %+v, want the rate-limit service on %s and %s and no proxy", st.L7, addr, sock)
	}
	// 198.18.77.1 over TCP and the Unix socket: one budget of 2.
	codes := []rlsv3.RateLimitResponse_Code{ask(tcp, "198.18.77.1").GetOverallCode(), ask(unix, "198.18.77.1").GetOverallCode(),
		ask(tcp, "198.18.77.1").GetOverallCode()}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	out, err := h.ctl("l7", "explain", "--domain", "edge", "--descriptor", "remote_address=198.18.77.1")
	// The class ranking works with an rls-only l7: section (the service
	// installs the ranking in the class table): an address the data plane
	// has no history for is new.
	if err != nil || !strings.Contains(out, "rule per-ip") || !strings.Contains(out, "gen-a") || !strings.Contains(out, "OVER_LIMIT") ||
		!strings.Contains(out, "client 198.18.77.1: next request charged as new") {
		t.Fatalf("edgectl l7 explain: %v\n%s", err, out)
	}

	// A reload: new limits on the same listeners, the connections kept.
	h.reload(section("gen-b"))
	if res := ask(tcp, "198.18.77.1"); res.GetStatuses()[0].GetCurrentLimit().GetName() != "gen-b" ||
		res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the reload: %v, want OK under gen-b", res)
	}

	// Escalation: more than 3 refusals of the client's own address within
	// a minute put it on the deny list.
	src := c.Src4.String()
	for range 6 {
		ask(unix, src)
	}
	h.waitDenied(netip.PrefixFrom(c.Src4, 32), "l7")
	mf := h.scrape()
	var over float64
	for _, m := range mf["edgeguard_l7_rls_requests_total"].GetMetric() {
		if m.GetLabel()[0].GetValue() == "over_limit" {
			over = m.GetCounter().GetValue()
		}
	}
	if over < 4 {
		t.Errorf("edgeguard_l7_rls_requests_total{code=over_limit} = %v after the reload, want at least 4", over)
	}
	// Per class, without addresses: the 7 requests since the reload were
	// new clients' (refused at least 4 times).
	byClass := map[string]float64{}
	for _, m := range mf["edgeguard_l7_rls_class_requests_total"].GetMetric() {
		var cl, res string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "class":
				cl = l.GetValue()
			case "result":
				res = l.GetValue()
			}
		}
		byClass[cl+"/"+res] = m.GetCounter().GetValue()
	}
	if byClass["new/admitted"]+byClass["new/refused"] != 7 || byClass["new/refused"] < 4 {
		t.Errorf("edgeguard_l7_rls_class_requests_total after the reload: %v, want 7 new, at least 4 refused", byClass)
	}
}
