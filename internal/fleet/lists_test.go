package fleet

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// memLists is a host's list table for these tests: what a daemon holds,
// in memory. The daemon's own checks (width, lists.protected) are tested
// with the real daemon in test/netns/fleet_test.go.
type memLists struct {
	mu     sync.Mutex
	local  map[string]ListEntry // this host's own
	remote map[string]ListEntry // from the fleet
}

func newMemLists() *memLists {
	return &memLists{local: map[string]ListEntry{}, remote: map[string]ListEntry{}}
}

func (m *memLists) ApplyRemote(entries []ListEntry, replace bool) (int, []Refusal, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if replace {
		m.remote = map[string]ListEntry{}
	}
	for _, e := range entries {
		if e.Op == OpDel {
			delete(m.remote, e.field())
			delete(m.local, e.field())
			continue
		}
		if _, mine := m.local[e.field()]; mine && replace {
			continue
		}
		delete(m.local, e.field())
		m.remote[e.field()] = e
	}
	return len(m.remote), nil, nil
}

func (m *memLists) Local() []ListEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ListEntry
	for _, e := range m.local {
		out = append(out, e)
	}
	return out
}

func (m *memLists) has(field string) (ListEntry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.remote[field]
	return e, ok
}

func (m *memLists) addLocal(f *Fleet, e ListEntry) {
	m.mu.Lock()
	m.local[e.field()] = e
	m.mu.Unlock()
	f.Publish(e)
}

func testClient(t *testing.T, addr string) redis.UniversalClient {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond, MaxRetries: -1, DialerRetries: 1})
	return c
}

type host struct {
	f     *Fleet
	lists *memLists
	stop  func()
}

func startHost(t *testing.T, addr, name string, aggs Aggregates) *host {
	t.Helper()
	return startHostWith(t, testClient(t, addr), name, aggs)
}

func startHostWith(t *testing.T, client redis.UniversalClient, name string, aggs Aggregates) *host {
	t.Helper()
	h := &host{lists: newMemLists()}
	f, err := New(Options{Name: "t", Host: name, Interval: 100 * time.Millisecond, Floor: 0.1, Client: client,
		Lists: h.lists, Aggregates: aggs})
	if err != nil {
		t.Fatal(err)
	}
	h.f = f
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	return h
}

// within polls cond for up to d (generous: the machine is shared).
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func deny(p string, host string) ListEntry {
	return ListEntry{Op: OpAdd, List: "deny", Prefix: netip.MustParsePrefix(p), Origin: "cli", Host: host,
		Expires: time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC(), Reason: "test", At: time.Now()}
}

func TestListsReachOtherHosts(t *testing.T) {
	srv := testenv.StartRedis(t)
	a := startHost(t, srv.Addr(), "a", nil)
	b := startHost(t, srv.Addr(), "b", nil)
	within(t, 5*time.Second, "hosts synced", func() bool { return a.f.Status().Lists.Synced && b.f.Status().Lists.Synced })
	a.lists.addLocal(a.f, deny("198.18.4.0/24", "a"))
	within(t, 5*time.Second, "a's deny on b", func() bool { _, ok := b.lists.has("deny|198.18.4.0/24"); return ok })
	e, _ := b.lists.has("deny|198.18.4.0/24")
	if e.Host != "a" || e.Origin != "cli" || e.Reason != "test" || e.Expires.IsZero() {
		t.Errorf("b got %+v", e)
	}
	if _, ok := a.lists.has("deny|198.18.4.0/24"); ok {
		t.Error("a applied its own entry as a remote one")
	}
	// A host that starts later gets the current set from the snapshot.
	c := startHost(t, srv.Addr(), "c", nil)
	within(t, 5*time.Second, "snapshot on c", func() bool { _, ok := c.lists.has("deny|198.18.4.0/24"); return ok })
	// A removal on b removes it everywhere.
	b.f.Publish(ListEntry{Op: OpDel, List: "deny", Prefix: netip.MustParsePrefix("198.18.4.0/24"), Origin: "cli"})
	within(t, 5*time.Second, "removal on c", func() bool { _, ok := c.lists.has("deny|198.18.4.0/24"); return !ok })
	if st := c.f.Status().Lists; st.Applied < 2 || !st.Synced {
		t.Errorf("c's list status %+v", st)
	}
}

// TestListsHostileRedis writes entries a compromised or confused party
// could put in the fleet's keys; hosts skip and count them, and apply the
// good entry written after them.
func TestListsHostileRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	k := newKeys("t")
	hostile := []string{
		`{"v":1,"op":"add","list":"deny","prefix":"0.0.0.0/0","origin":"cli","host":"x","at_ms":1}`,
		`{"v":1,"op":"add","list":"deny","prefix":"::/0","origin":"cli","host":"x","at_ms":1}`,
		`not json at all`,
		`{"v":1,"op":"add","list":"deny","prefix":"198.18.0.0/24","origin":"cli","host":"x y","at_ms":1}`,
	}
	// In the snapshot, under a field that does not match, and under its own.
	rc.HSet(ctx, k.snap, "deny|0.0.0.0/0", hostile[0], "deny|198.18.9.0/24", deny("198.18.8.0/24", "x").Encode())
	b := startHost(t, srv.Addr(), "b", nil)
	within(t, 5*time.Second, "b synced", func() bool { return b.f.Status().Lists.Synced })
	for _, h := range hostile {
		rc.XAdd(ctx, &redis.XAddArgs{Stream: k.stream, Values: []any{"e", h}})
	}
	rc.XAdd(ctx, &redis.XAddArgs{Stream: k.stream, Values: []any{"e", string(deny("198.18.5.0/24", "x").Encode()), "extra", "1"}})
	rc.XAdd(ctx, &redis.XAddArgs{Stream: k.stream, Values: []any{"e", string(deny("198.18.6.0/24", "x").Encode())}})
	within(t, 5*time.Second, "the good entry", func() bool { _, ok := b.lists.has("deny|198.18.6.0/24"); return ok })
	b.lists.mu.Lock()
	got := fmt.Sprint(b.lists.remote)
	n := len(b.lists.remote)
	b.lists.mu.Unlock()
	if n != 1 {
		t.Errorf("b applied %d entries, want only the good one: %s", n, got)
	}
	if st := b.f.Status().Lists; st.Malformed < 7 {
		t.Errorf("malformed = %d, want at least 7 (2 snapshot fields, 5 stream entries)", st.Malformed)
	}
}

// TestListsRedisRestart: entries added while Redis is down are published
// when it returns, and a host that was away catches up from the snapshot.
func TestListsRedisRestart(t *testing.T) {
	srv := testenv.StartRedis(t)
	a := startHost(t, srv.Addr(), "a", nil)
	b := startHost(t, srv.Addr(), "b", nil)
	within(t, 5*time.Second, "synced", func() bool { return a.f.Status().Lists.Synced && b.f.Status().Lists.Synced })
	srv.Stop()
	within(t, 5*time.Second, "a sees redis down", func() bool { return !a.f.Status().Lists.Synced })
	a.lists.addLocal(a.f, deny("198.18.7.0/24", "a"))
	srv.Restart() // empty: no persistence
	within(t, 10*time.Second, "a's entry on b after the restart", func() bool { _, ok := b.lists.has("deny|198.18.7.0/24"); return ok })
}
