package redislimit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// A one-node Redis Cluster still refuses commands whose keys span slots
// (CROSSSLOT), so it checks the hash tags and the ClusterClient path (one
// EVALSHA per request in a pipeline) for real.
func TestClusterHashTags(t *testing.T) {
	srv := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	node := srv.Client(t)
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("assign slots: %v", err)
	}
	testenv.WaitFor(t, "cluster_state:ok", func() bool {
		info, _ := node.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok")
	})
	// The guard: without a shared tag, two keys in one EVALSHA are refused.
	err := node.Eval(ctx, "return 1", []string{"eg:l7:a:r1", "eg:l7:b:r2"}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("cluster accepted keys from two slots in one script (%v): the test would prove nothing", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}, MaxRetries: -1, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	l, err := New(Config{Client: cc, Registerer: prometheus.NewRegistry(), Rules: []Rule{
		{Name: "per-second", Algorithm: GCRA, Limit: 2, Window: time.Second},
		{Name: "per-hour", Algorithm: SlidingWindow, Limit: 100, Window: time.Hour},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, key := range []string{"203.0.113.7", "}", "", "2001:db8::1"} {
		for i := range 3 {
			res, err := l.Allow(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if res.Rules[0].Source != SourceRedis || res.Rules[1].Source != SourceRedis {
				t.Fatalf("key %q: decided by %s/%s, want redis (CROSSSLOT?)", key, res.Rules[0].Source, res.Rules[1].Source)
			}
			if res.Decision.Allowed != (i < 2) {
				t.Fatalf("key %q request %d: allowed=%v", key, i, res.Decision.Allowed)
			}
		}
	}
	// Concurrent requests for many keys go out as pipelines of EVALSHAs.
	var wg sync.WaitGroup
	errs := make(chan string, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				res, err := l.Allow(ctx, "client-"+strconv.Itoa(g*10+i))
				if err != nil || res.Rules[0].Source != SourceRedis || !res.Decision.Allowed {
					errs <- fmt.Sprintf("goroutine %d: %+v %v", g, res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
