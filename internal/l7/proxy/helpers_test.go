package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
)

// ServeListener serves p on ln with the engine its Config names until ctx
// ends, then closes p: the proxy's tests drive a Proxy through both
// engines without the L7 stage (internal/l7/stage, which imports this
// package, serves the daemon's Proxy the same way and is tested there,
// reload and shutdown included).
func (p *Proxy) ServeListener(ctx context.Context, ln net.Listener) error {
	defer p.Close()
	const shutdownTimeout = 10 * time.Second
	if p.cfg.ServingEngine() == EngineEventLoop {
		ec := eventloop.Config{
			Upstream:          p.cfg.Upstream,
			Handler:           p,
			TrustedPeer:       p.Trusted,
			BadGateway:        p.BadGateway,
			Logger:            p.log,
			Loops:             p.cfg.Loops,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ShutdownTimeout:   shutdownTimeout,
			AcceptPaused:      p.AcceptPaused,
		}
		p.cfg.ApplyRules(&ec)
		srv, err := eventloop.New(ec)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("proxy: %w", err)
		}
		return srv.Serve(ctx, ln)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: MaxHeaderBytes}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(CountAcceptPauses(ln, p.AcceptPaused)) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return err
	}
	<-done
	return nil
}

// upstream is a real HTTP server on loopback that answers 200 and echoes
// what it received in response headers.
type upstream struct {
	srv  *httptest.Server
	hits atomic.Int64
	// hold, when set, blocks each request until it is closed or receives.
	hold chan struct{}
	// entered receives one value per request that reached the handler.
	entered chan struct{}
}

func startUpstreamB(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

func startProxyB(b *testing.B, cfg *Config) (*Proxy, string) {
	p, err := New(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.ServeListener(ctx, ln) }()
	b.Cleanup(func() { cancel(); <-done })
	return p, "http://" + ln.Addr().String()
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
		if u.hold != nil {
			select {
			case <-u.hold:
			case <-r.Context().Done():
			}
		}
		w.Header().Set("X-Seen-Path", r.URL.Path)
		w.Header().Set("X-Seen-Host", r.Host)
		w.Header().Set("X-Seen-Xff", r.Header.Get("X-Forwarded-For"))
		_, _ = io.WriteString(w, "upstream ok")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// decodeYAML decodes an l7: document (the whole policy file shape: a
// mapping with an l7 key), replacing UPSTREAM with up.
func decodeYAML(t *testing.T, src, up string) *Config {
	t.Helper()
	src = strings.ReplaceAll(src, "UPSTREAM", up)
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	node := l7Node(&doc)
	cfg, probs := Decode(node, "test.yaml")
	if len(probs) > 0 {
		t.Fatalf("decode: %v", probs)
	}
	return cfg
}

func l7Node(doc *yaml.Node) *yaml.Node {
	root := doc
	if root.Kind == yaml.DocumentNode {
		root = root.Content[0]
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "l7" {
			return root.Content[i+1]
		}
	}
	return nil
}

// startProxy runs a Proxy on a free loopback port until the test ends and
// returns its base URL.
func startProxy(t *testing.T, cfg *Config, opts Options) (*Proxy, string) {
	t.Helper()
	p, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.ServeListener(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ServeListener: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("ServeListener did not return after cancel")
		}
	})
	return p, "http://" + ln.Addr().String()
}

type reqOpt func(*http.Request)

func withHeader(k, v string) reqOpt { return func(r *http.Request) { r.Header.Set(k, v) } }
func withHost(h string) reqOpt      { return func(r *http.Request) { r.Host = h } }

var testClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

func do(t *testing.T, method, url string, opts ...reqOpt) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

func status(t *testing.T, method, url string, opts ...reqOpt) int {
	t.Helper()
	return do(t, method, url, opts...).StatusCode
}

func problemOf(t *testing.T, resp *http.Response) l7.Problem {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json", ct)
	}
	var p l7.Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("problem body: %v", err)
	}
	return p
}
