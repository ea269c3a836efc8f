package redislimit

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestRefusedFailsAtOnce: with the client the proxy builds
// (ClientOptions), a decision against a Redis that is down (connection
// refused) dials once, not go-redis's default five times with backoff, and
// the failure is counted as refused, not timeout or connection. The
// timeout is long (2s) so that retries, had they happened, would have had
// time for all five attempts.
func TestRefusedFailsAtOnce(t *testing.T) {
	f := newFixture(t)
	opts := ClientOptions(f.srv.Addr(), 2*time.Second)
	var dials atomic.Int64
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	logs := &testenv.SyncBuffer{}
	l := f.limiter(t, Config{Client: rdb, Registerer: prometheus.NewRegistry(), Timeout: 2 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Rules:  []Rule{{Name: "r", Algorithm: GCRA, Limit: 100, Window: time.Second}}})
	if res := allow(t, l, "k"); res.Rules[0].Source != SourceRedis {
		t.Fatalf("healthy: %+v", res)
	}
	f.srv.Stop()
	rdb.Close() // no pooled connection left: the next decision dials
	rdb = redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	reg2 := prometheus.NewRegistry()
	l2 := f.limiter(t, Config{Client: rdb, Registerer: reg2, Timeout: 2 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Rules:  []Rule{{Name: "r", Algorithm: GCRA, Limit: 100, Window: time.Second}}})
	dials.Store(0)
	if res := allow(t, l2, "k"); res.Rules[0].Source != SourceFailOpen {
		t.Fatalf("redis down: %+v, want fail_open", res)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for one refused decision, want 1 (no dial retries inside a decision)", n)
	}
	kinds := map[string]float64{}
	mfs, err := reg2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_l7_redis_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "kind" {
					kinds[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	if kinds["refused"] != 1 || kinds["timeout"] != 0 || kinds["connection"] != 0 {
		t.Fatalf("errors by kind %v, want one refused", kinds)
	}
	// The log line is structured (JSON here), with the kind as a field.
	var line string
	for _, ln := range strings.Split(logs.String(), "\n") {
		if strings.Contains(ln, "round trip failed") {
			line = ln
		}
	}
	if !strings.Contains(line, `"kind":"refused"`) || !strings.Contains(line, `"op":"decide"`) {
		t.Fatalf("log line %q, want a structured line with kind=refused op=decide", line)
	}

	// go-redis's own messages go through ClientLogger as structured lines.
	var buf bytes.Buffer
	ClientLogger(slog.New(slog.NewJSONHandler(&buf, nil))).Printf(context.Background(), "redis: failed to dial after %d attempts: %v", 1, "refused")
	if !strings.Contains(buf.String(), `"msg":"redis client","message":"redis: failed to dial after 1 attempts: refused"`) {
		t.Fatalf("client log line %q", buf.String())
	}
}
