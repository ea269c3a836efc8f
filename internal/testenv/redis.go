package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a real redis-server on a free loopback port, owned by one test:
// no persistence, a temporary directory, killed in t.Cleanup.
type Redis struct {
	t     testing.TB
	dir   string
	port  int
	extra []string
	// Cmd is the running server process (tests signal it to hang it).
	Cmd *exec.Cmd
}

// StartRedis starts redis-server or skips (fails in CI) if there is none
// on PATH.
func StartRedis(t testing.TB, extraArgs ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if InCI() {
			t.Fatalf("redis-server not on PATH (CI=true): install it with apt-get install -y redis-server")
		}
		t.Skip("redis-server not on PATH: apt-get install -y redis-server to run the Redis backend tests")
	}
	s := &Redis{t: t, dir: t.TempDir(), port: freePort(t), extra: extraArgs}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free loopback port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Addr is the server's host:port.
func (s *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// start launches the server on s.port and waits until it answers PING.
func (s *Redis) start() {
	s.t.Helper()
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"), "--protected-mode", "yes",
	}, s.extra...)
	s.Cmd = exec.Command("redis-server", args...)
	if err := s.Cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server on %s did not answer PING within 10s: %v\n%s", s.Addr(), err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server and waits for it to exit.
func (s *Redis) Stop() {
	if s.Cmd == nil || s.Cmd.Process == nil {
		return
	}
	_ = s.Cmd.Process.Kill()
	_ = s.Cmd.Wait()
	s.Cmd = nil
}

// Restart starts the server again on the same port (empty: no persistence).
func (s *Redis) Restart() { s.start() }

// Client returns a pooled client with short timeouts, closed in Cleanup.
func (s *Redis) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:          s.Addr(),
		DialTimeout:   200 * time.Millisecond,
		ReadTimeout:   200 * time.Millisecond,
		WriteTimeout:  200 * time.Millisecond,
		MaxRetries:    -1, // the breaker decides; no retry storms
		DialerRetries: 1,
		PoolSize:      64,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Redis) String() string { return fmt.Sprintf("redis-server %s", s.Addr()) }
