package netns_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/test/netns"
)

// serveHTTP serves h on addr inside ns until the test ends, as the L7
// stage's upstream, and returns the listener's address.
func serveHTTP(t *testing.T, ns *netns.Namespace, addr netip.AddrPort, h http.HandlerFunc) net.Addr {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatalf("upstream on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr()
}

// nsTransport is an HTTP transport that dials inside ns, from src unless
// src is the zero Addr, one connection per request.
func nsTransport(ns *netns.Namespace, src netip.Addr, timeout time.Duration) *http.Transport {
	return &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := ns.Do(func() (err error) {
			d := net.Dialer{Timeout: timeout}
			if src.IsValid() {
				d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
			}
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}}
}
