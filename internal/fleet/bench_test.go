package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// commandsProcessed is Redis's total_commands_processed.
func commandsProcessed(b *testing.B, c *redis.Client) int64 {
	b.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// BenchmarkFleetSync is one host's share sync (heartbeat, publish and read
// demand) against a real redis-server, by active aggregates. It reports
// the Redis commands one sync costs (counted by the server) and the
// commands per second a host sends at a 1 s interval (at interval T,
// divide by T). The peer in the same run is one PING round trip
// (ns/op of the ping case), to read sync times as round trips.
func BenchmarkFleetSync(b *testing.B) {
	srv := testenv.StartRedis(b)
	admin := srv.Client(b)
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := admin.Ping(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("aggregates=%d", n), func(b *testing.B) {
			clk := &clock{t: time.Now()}
			h := newShareHost(b, srv.Client(b), "a", clk)
			for i := range n {
				h.aggs.offer(fmt.Sprintf("rule 1 asn %d", 64500+i), 1000, 10)
			}
			h.sync() // first sight: no rates yet
			before := commandsProcessed(b, admin)
			syncs := 0
			for b.Loop() {
				clk.add(time.Second)
				for k := range h.aggs.c {
					h.aggs.offer(k, 1000, 10)
				}
				h.sync()
				syncs++
			}
			b.StopTimer()
			cmds := float64(commandsProcessed(b, admin)-before-1) / float64(syncs)
			b.ReportMetric(cmds, "cmds/sync")
			b.ReportMetric(cmds, "cmds/s@1s")
			if h.f.Status().LastError != "" {
				b.Fatalf("sync failed: %s", h.f.Status().LastError)
			}
		})
	}
}
