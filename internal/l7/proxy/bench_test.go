package proxy

import (
	"io"
	"net/http"
	"net/netip"
	"testing"

	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// BenchmarkProxyLoopback sends requests through a real proxy on loopback to
// a real upstream: /never is limited but never hit, /always is always
// rejected, /unmatched matches no route.
func BenchmarkProxyLoopback(b *testing.B) {
	t := &testing.T{}
	up := startUpstreamB(b)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: never
      match: {path_prefix: /never}
      limits: [{name: never-hit, key: ip, rate: 100000000/s}]
    - name: always
      match: {path_prefix: /always}
      limits: [{name: always-hit, key: ip, rate: 1/h, burst: 1}]
`, up)
	p, base := startProxyB(b, cfg)
	_ = p
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for _, path := range []string{"/never", "/always", "/unmatched"} {
		b.Run(path[1:], func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(base + path)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

// BenchmarkLimitHandler is the proxy's handler without the network: route
// matching, the limit check and a rejection (429) written to a discarding
// writer.
func BenchmarkLimitHandler(b *testing.B) {
	cfg := decodeYAML(&testing.T{}, `
l7:
  listen: 127.0.0.1:0
  upstream: http://127.0.0.1:1
  routes:
    - name: always
      match: {path_prefix: /always}
      limits: [{name: always-hit, key: ip, rate: 1/h, burst: 1}]
`, "")
	p, err := New(cfg, Options{Clock: new(l7test.ManualClock)})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	r, _ := http.NewRequest("GET", "http://x/always", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		p.ServeHTTP(w, r)
	}
}

// BenchmarkLimitHandlerClasses is BenchmarkLimitHandler without and with
// the class ranking (Options.Classes), in the same run: the cost of
// classifying each request (the client's entry in the class table, its
// cached standing, its usual rate) and of counting its end. One client
// (its entry always cached), and 4,096 clients in turn.
func BenchmarkLimitHandlerClasses(b *testing.B) {
	cfg := decodeYAML(&testing.T{}, `
l7:
  listen: 127.0.0.1:0
  upstream: http://127.0.0.1:1
  routes:
    - name: always
      match: {path_prefix: /always}
      limits: [{name: always-hit, key: ip, rate: 1/h, burst: 1}]
`, "")
	for _, c := range []struct {
		name    string
		classes bool
		clients int
	}{{"plain", false, 1}, {"classes", true, 1}, {"plain-4096", false, 4096}, {"classes-4096", true, 4096}} {
		b.Run(c.name, func(b *testing.B) {
			clock := new(l7test.ManualClock)
			opts := Options{Clock: clock}
			if c.classes {
				opts.Classes = class.NewTable(0, nil, clock, class.Config{})
			}
			p, err := New(cfg, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			reqs := make([]*http.Request, c.clients)
			for i := range reqs {
				reqs[i], _ = http.NewRequest("GET", "http://x/always", nil)
				reqs[i].RemoteAddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 1234).String()
			}
			w := &discardWriter{h: http.Header{}}
			for _, r := range reqs {
				p.ServeHTTP(w, r) // each client's one admitted request (a 502: no upstream)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clear(w.h)
				p.ServeHTTP(w, reqs[i%len(reqs)])
				i++
			}
		})
	}
}
