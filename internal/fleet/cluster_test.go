package fleet

import (
	"context"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// startCluster starts a three-node Redis Cluster on loopback (no
// replicas) and waits until every node says cluster_state:ok.
func startCluster(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not on PATH: apt-get install -y redis-tools")
	}
	var addrs []string
	for range 3 {
		srv := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		addrs = append(addrs, srv.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, _ := c.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s: cluster not ok within 20s:\n%s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

func clusterClient(t *testing.T, addrs []string) redis.UniversalClient {
	t.Helper()
	c, err := NewClient(policy.FleetRedis{Addrs: addrs, Cluster: true, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCluster runs the shared lists and the shares against a three-node
// Redis Cluster: the list keys share one slot ({name} tag, so the stream
// and snapshot transaction is allowed), the aggregate keys spread over
// the nodes.
func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	a := startHostWith(t, clusterClient(t, addrs), "a", nil)
	b := startHostWith(t, clusterClient(t, addrs), "b", nil)
	within(t, 10*time.Second, "hosts synced", func() bool { return a.f.Status().Lists.Synced && b.f.Status().Lists.Synced })
	a.lists.addLocal(a.f, deny("198.18.4.0/24", "a"))
	within(t, 5*time.Second, "a's deny on b", func() bool { _, ok := b.lists.has("deny|198.18.4.0/24"); return ok })
	c := startHostWith(t, clusterClient(t, addrs), "c", nil)
	within(t, 10*time.Second, "snapshot on c", func() bool { _, ok := c.lists.has("deny|198.18.4.0/24"); return ok })

	clk := &clock{t: time.Now()}
	var hosts []*shareHost
	for _, n := range []string{"a", "b", "c"} {
		hosts = append(hosts, newShareHost(t, clusterClient(t, addrs), n, clk))
	}
	// Many aggregates, so their keys land on every node.
	keys := []string{"rule 1 asn 64500", "rule 1 asn 64501", "rule 1 asn 64502", "rule 1 asn 64503", "rule 2 whole"}
	for range 3 {
		clk.add(time.Second)
		for i, h := range hosts {
			for _, k := range keys {
				h.aggs.offer(k, 1000, []uint64{2700, 270, 30}[i])
			}
		}
		for _, h := range hosts {
			h.sync()
		}
	}
	for _, k := range keys {
		sum := 0.0
		for _, h := range hosts {
			s := h.aggs.share(k)
			if s.Static {
				t.Fatalf("%s: static share %+v: the cluster exchange failed (%s)", k, s, h.f.Status().LastError)
			}
			sum += s.Rate
		}
		if math.Abs(sum-1000) > 1 {
			t.Errorf("%s: shares sum to %.1f", k, sum)
		}
		if s := hosts[0].aggs.share(k); s.Fraction() < 0.8 {
			t.Errorf("%s: a's share %+v", k, s)
		}
	}
}
