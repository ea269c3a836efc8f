package rls

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

// decodeL7 decodes a policy document's l7: section (the whole file shape)
// into the proxy's config and the service's.
func decodeL7(t testing.TB, src string) (*proxy.Config, *Config) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	root := doc.Content[0]
	var node *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "l7" {
			node = root.Content[i+1]
		}
	}
	pc, probs := proxy.Decode(node, "test.yaml")
	if len(probs) > 0 {
		t.Fatalf("decode l7: %v", probs)
	}
	rc, probs := Decode(pc, "test.yaml")
	if len(probs) > 0 {
		t.Fatalf("decode rls: %v", probs)
	}
	return pc, rc
}

// startServer serves cfg until the test ends (TCP on a free loopback port,
// and a Unix socket in a temporary directory when the config names
// UNIXSOCK).
func startServer(t testing.TB, src string, clock l7.Clock, esc proxy.Escalator) (*Server, *Config) {
	t.Helper()
	src = strings.ReplaceAll(src, "UNIXSOCK", filepath.Join(t.TempDir(), "rls.sock"))
	_, cfg := decodeL7(t, src)
	s := NewServer(ServerOptions{Clock: clock, Escalator: esc})
	t.Cleanup(s.Close)
	ch, err := s.Prepare(cfg)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	ch.Commit()
	return s, cfg
}

// reload prepares and commits src on s.
func reload(t testing.TB, s *Server, src string) {
	t.Helper()
	_, cfg := decodeL7(t, src)
	ch, err := s.Prepare(cfg)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	ch.Commit()
}

// dial returns an Envoy RLS client on target ("127.0.0.1:port" or
// "unix:///path").
func dial(t testing.TB, target string) (rlsv3.RateLimitServiceClient, *grpc.ClientConn) {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc), cc
}

// desc builds an Envoy descriptor from "k=v" entries.
func desc(entries ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func ask(t testing.TB, c rlsv3.RateLimitServiceClient, domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return res
}

func headers(res *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range res.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

func replaceUnix(src, sock string) string {
	return strings.Replace(src, "/tmp/unused-replaced", sock, 1)
}
