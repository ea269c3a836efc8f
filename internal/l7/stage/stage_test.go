package stage

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

// upstream is a real HTTP server on loopback. Its answer carries a field
// written in lower case, as sent on the wire: the event loop relays field
// names as they came, net/http's ReverseProxy canonicalises them
// ("X-Raw-Case"). That difference tells the engines apart from outside.
type upstream struct {
	srv  *httptest.Server
	hits atomic.Int64
	// hold, when set, blocks each request until closed.
	hold    atomic.Pointer[chan struct{}]
	entered chan struct{}
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{entered: make(chan struct{}, 64)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		select {
		case u.entered <- struct{}{}:
		default:
		}
		if hold := u.hold.Load(); hold != nil {
			select {
			case <-*hold:
			case <-r.Context().Done():
			}
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header()["x-raw-case"] = []string{"1"}
		_, _ = io.WriteString(w, "upstream ok")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// config decodes an l7: section (YAML inside "l7:").
func config(t *testing.T, body string) (*proxy.Config, []byte) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	cfg, probs := proxy.Decode(doc.Content[0], "test.yaml")
	if len(probs) > 0 {
		t.Fatalf("decode: %v", probs)
	}
	return cfg, []byte(body)
}

func section(listen, up, engine string, extra string) string {
	return fmt.Sprintf("listen: %s\nupstream: %s\nengine: %s\nloops: 1\n%s", listen, up, engine, extra)
}

const limited = `routes:
  - name: api
    match: {path_prefix: /limited}
    limits: [{name: one, key: ip, rate: 1/h, burst: 1}]
`

func newStage(t *testing.T, opts Options) *Stage {
	t.Helper()
	s := New(opts)
	t.Cleanup(s.Close)
	return s
}

// apply prepares and commits an l7: section ("": none).
func apply(t *testing.T, s *Stage, body string) {
	t.Helper()
	var cfg *proxy.Config
	var raw []byte
	if body != "" {
		cfg, raw = config(t, body)
	}
	ch, err := s.Prepare(context.Background(), cfg, raw, Standing{})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	ch.Commit()
}

// rawGet sends one request on a new connection and returns the response
// head as received, and the status.
func rawGet(t *testing.T, addr, path string) (string, int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", path)
	br := bufio.NewReader(c)
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read head from %s: %v (so far %q)", addr, err, head.String())
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head.String())), nil)
	if err != nil {
		t.Fatalf("parse head %q: %v", head.String(), err)
	}
	return head.String(), resp.StatusCode
}

// engineOf tells from a response head which engine relayed it.
func engineOf(head string) proxy.Engine {
	if strings.Contains(head, "\r\nx-raw-case: 1\r\n") {
		return proxy.EngineEventLoop
	}
	if strings.Contains(head, "\r\nX-Raw-Case: 1\r\n") {
		return proxy.EngineNetHTTP
	}
	return ""
}

func gather(t *testing.T, s *Stage) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestEngineServes: the stage serves with the engine the section names
// (auto: the event loop for an http upstream), tells which in its metric,
// and the wire shows the engine's own behaviour.
func TestEngineServes(t *testing.T) {
	up := startUpstream(t)
	for _, c := range []struct {
		engine string
		want   proxy.Engine
	}{{"auto", proxy.EngineEventLoop}, {"event-loop", proxy.EngineEventLoop}, {"net-http", proxy.EngineNetHTTP}} {
		t.Run(c.engine, func(t *testing.T) {
			s := newStage(t, Options{})
			addr := freeAddr(t)
			apply(t, s, section(addr, up.srv.URL, c.engine, limited))
			head, code := rawGet(t, addr, "/x")
			if code != 200 || engineOf(head) != c.want {
				t.Fatalf("status %d, relayed by %q, want 200 by %s:\n%s", code, engineOf(head), c.want, head)
			}
			if _, code := rawGet(t, addr, "/limited"); code != 200 {
				t.Fatalf("first /limited: %d", code)
			}
			if _, code := rawGet(t, addr, "/limited"); code != 429 {
				t.Fatalf("second /limited: %d, want 429", code)
			}
			m := gather(t, s)
			if m[fmt.Sprintf("edgeguard_l7_stage_info{addr=%s,engine=%s}", addr, c.want)] != 1 {
				t.Fatalf("no stage info for %s on %s: %v", c.want, addr, m)
			}
			if m[`rate_limit_rejected_total{layer=l7,reason=quota_exceeded,rule=one}`] != 1 {
				t.Fatalf("the serving proxy's series are not collected: %v", m)
			}
			if st := s.Status(); !st.Running || st.Engine != c.want || st.Addr != addr || len(st.Routes) != 1 {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// TestPrepareTakenPort: a section whose listen port is taken fails in
// Prepare, and the stage goes on serving what it served, on its own port.
func TestPrepareTakenPort(t *testing.T) {
	up := startUpstream(t)
	s := newStage(t, Options{})
	addr := freeAddr(t)
	apply(t, s, section(addr, up.srv.URL, "event-loop", ""))
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg, raw := config(t, section(taken.Addr().String(), up.srv.URL, "net-http", ""))
	if _, err := s.Prepare(context.Background(), cfg, raw, Standing{}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Prepare on a taken port: %v, want address already in use", err)
	}
	if head, code := rawGet(t, addr, "/"); code != 200 || engineOf(head) != proxy.EngineEventLoop {
		t.Fatalf("after the failed prepare: %d by %q", code, engineOf(head))
	}
	if st := s.Status(); st.Addr != addr || st.Engine != proxy.EngineEventLoop {
		t.Fatalf("status changed: %+v", st)
	}
}

// TestAbort: an aborted change leaves the stage as it was and the socket
// it bound free again.
func TestAbort(t *testing.T) {
	up := startUpstream(t)
	s := newStage(t, Options{})
	addr := freeAddr(t)
	apply(t, s, section(addr, up.srv.URL, "event-loop", ""))
	other := freeAddr(t)
	cfg, raw := config(t, section(other, up.srv.URL, "net-http", ""))
	ch, err := s.Prepare(context.Background(), cfg, raw, Standing{})
	if err != nil {
		t.Fatal(err)
	}
	// Prepared, not committed: nothing serves on the new address yet, the
	// old one serves with the old engine.
	if head, code := rawGet(t, addr, "/"); code != 200 || engineOf(head) != proxy.EngineEventLoop {
		t.Fatalf("while prepared: %d by %q", code, engineOf(head))
	}
	ch.Abort()
	ch.Commit() // a no-op after Abort
	ln, err := net.Listen("tcp", other)
	if err != nil {
		t.Fatalf("the aborted change's address is still bound: %v", err)
	}
	ln.Close()
	if st := s.Status(); st.Addr != addr || st.Engine != proxy.EngineEventLoop {
		t.Fatalf("status after abort: %+v", st)
	}
	// Another engine on the same address, aborted: the socket stays open
	// and served by the running engine.
	cfg, raw = config(t, section(addr, up.srv.URL, "net-http", ""))
	ch, err = s.Prepare(context.Background(), cfg, raw, Standing{})
	if err != nil {
		t.Fatal(err)
	}
	ch.Abort()
	if head, code := rawGet(t, addr, "/"); code != 200 || engineOf(head) != proxy.EngineEventLoop {
		t.Fatalf("after an aborted engine change: %d by %q", code, engineOf(head))
	}
}

// TestReload: a new section with the same engine swaps the proxy on the
// running engine (a kept-alive connection sees the new limits at once); a
// new engine starts on the same socket with no refused connection; a new
// address moves the stage; no section stops it.
func TestReload(t *testing.T) {
	up := startUpstream(t)
	s := newStage(t, Options{})
	addr := freeAddr(t)
	apply(t, s, section(addr, up.srv.URL, "event-loop", ""))

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	get := func(path string) int {
		t.Helper()
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := get("/limited"); c != 200 {
		t.Fatalf("before the reload: %d", c)
	}
	apply(t, s, section(addr, up.srv.URL, "event-loop", limited))
	if c1, c2 := get("/limited"), get("/limited"); c1 != 200 || c2 != 429 {
		t.Fatalf("after a reload adding a limit: %d, %d; want 200, 429", c1, c2)
	}
	if m := gather(t, s); m["edgeguard_l7_stage_engine_starts_total"] != 1 {
		t.Fatalf("a handler swap started an engine: %v", m)
	}

	// While the engine changes, clients keep connecting: none is refused.
	stopLoad := make(chan struct{})
	loadErr := make(chan error, 1)
	go func() {
		defer close(loadErr)
		for {
			select {
			case <-stopLoad:
				return
			default:
			}
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				loadErr <- err
				return
			}
			c.Close()
		}
	}()
	apply(t, s, section(addr, up.srv.URL, "net-http", limited))
	time.Sleep(100 * time.Millisecond)
	close(stopLoad)
	if err := <-loadErr; err != nil {
		t.Fatalf("a connection was refused while the engine changed: %v", err)
	}
	if head, code := rawGet(t, addr, "/x"); code != 200 || engineOf(head) != proxy.EngineNetHTTP {
		t.Fatalf("after the engine change: %d by %q", code, engineOf(head))
	}
	if m := gather(t, s); m["edgeguard_l7_stage_engine_starts_total"] != 2 ||
		m[fmt.Sprintf("edgeguard_l7_stage_info{addr=%s,engine=net-http}", addr)] != 1 {
		t.Fatalf("metrics after the engine change: %v", m)
	}

	other := freeAddr(t)
	apply(t, s, section(other, up.srv.URL, "net-http", limited))
	if _, code := rawGet(t, other, "/x"); code != 200 {
		t.Fatalf("on the new address: %d", code)
	}
	waitClosed(t, addr)

	apply(t, s, "")
	waitClosed(t, other)
	if st := s.Status(); st.Running {
		t.Fatalf("status after stop: %+v", st)
	}
	if _, ok := gather(t, s)[fmt.Sprintf("edgeguard_l7_stage_info{addr=%s,engine=net-http}", other)]; ok {
		t.Fatal("stage info left after the stage stopped")
	}
}

func waitClosed(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(ShutdownTimeout + 5*time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCloseWaitsForRequests: Close stops accepting, lets the request in
// flight finish, then returns with nothing listening; for both engines.
func TestCloseWaitsForRequests(t *testing.T) {
	for _, engine := range []string{"event-loop", "net-http"} {
		t.Run(engine, func(t *testing.T) {
			up := startUpstream(t)
			hold := make(chan struct{})
			up.hold.Store(&hold)
			s := New(Options{})
			addr := freeAddr(t)
			apply(t, s, section(addr, up.srv.URL, engine, ""))
			got := make(chan int, 1)
			go func() {
				resp, err := http.Get("http://" + addr + "/slow")
				if err != nil {
					got <- -1
					return
				}
				resp.Body.Close()
				got <- resp.StatusCode
			}()
			select {
			case <-up.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("request never reached the upstream")
			}
			closed := make(chan struct{})
			go func() { s.Close(); close(closed) }()
			select {
			case <-closed:
				t.Fatal("Close returned with a request in flight")
			case <-time.After(300 * time.Millisecond):
			}
			close(hold)
			if c := <-got; c != 200 {
				t.Fatalf("in-flight request during shutdown: %d, want 200", c)
			}
			<-closed
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				t.Fatal("still listening after Close returned")
			}
			if _, err := s.Prepare(context.Background(), nil, nil, Standing{}); err == nil {
				t.Fatal("Prepare after Close succeeded")
			}
		})
	}
}

// TestBodyReadTimeout: under net/http a request body that stops coming is
// given up after the body read timeout (the upstream sees a cut request, the
// client's connection is closed), while a slow upstream answer after a
// complete body is not cut off by it.
func TestBodyReadTimeout(t *testing.T) {
	up := startUpstream(t)
	s := newStage(t, Options{})
	addr := freeAddr(t)
	apply(t, s, section(addr, up.srv.URL, "net-http", "timeouts: {body: 300ms}\n"))

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nonly ten b")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(c) // whatever answer, then the close
	if err != nil {
		t.Fatalf("the stalled body's connection was not closed: %v", err)
	}
	if time.Since(start) > 8*time.Second {
		t.Fatalf("closed after %v", time.Since(start))
	}

	// A complete body, then an answer slower than the body timeout.
	hold := make(chan struct{})
	up.hold.Store(&hold)
	go func() { time.Sleep(time.Second); close(hold) }()
	resp, err := http.Post("http://"+addr+"/slow", "text/plain", strings.NewReader("complete body"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "upstream ok" {
		t.Fatalf("slow answer after a complete body: %d %q", resp.StatusCode, body)
	}
}
