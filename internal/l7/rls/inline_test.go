package rls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/l7/redislimit"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// inlinePolicy: a hybrid limit alone, a hybrid limit with a local one, a
// hybrid limit with a redis one (one Redis group: it always asks Redis),
// with small leases so that keys sync often.
func inlinePolicy(addr, prefix string, hosts int) string {
	return fmt.Sprintf(`
l7:
  redis: {addr: %s, prefix: "%s", hosts: %d, sync_interval: 10s}
  rls:
    listen: 127.0.0.1:0
    rules:
      - name: per-tenant
        domain: edge
        descriptor: [tenant]
        limits:
          - {name: tenant-hybrid, rate: 30/min, algorithm: sliding-window, backend: hybrid, lease: 3}
      - name: per-user
        domain: edge
        descriptor: [user_id]
        limits:
          - {name: user-hybrid, rate: 20/min, algorithm: sliding-window, backend: hybrid, lease: 3}
          - {name: user-local, rate: 12/min, algorithm: sliding-window}
      - name: per-key
        domain: edge
        descriptor: [api_key]
        limits:
          - {name: key-hybrid, rate: 25/min, algorithm: sliding-window, backend: hybrid, lease: 3}
          - {name: key-redis, rate: 15/min, backend: redis}
`, addr, prefix, hosts)
}

// TestInlineEquivalence: a Service deciding as the gRPC reader does
// (tryDecide, and Decide when it would wait) and one deciding every
// request with Decide (the worker's path) answer the same sequence with
// the same decisions, remaining counts, statuses and headers, and count
// the same, with hybrid limits at hosts 1 and hosts 3, a request with a
// hybrid and a local limit, one with a hybrid and a redis limit, requests
// with several descriptors and hits_addend. Both run on one scripted
// clock (their own and Redis's scripts'), on their own keys of one
// redis-server; the test fails unless some decisions were made inline and
// some were deferred.
func TestInlineEquivalence(t *testing.T) {
	rs := testenv.StartRedis(t)
	for _, hosts := range []int{1, 3} {
		t.Run(fmt.Sprintf("hosts %d", hosts), func(t *testing.T) { testInlineEquivalence(t, rs.Addr(), hosts) })
	}
}

func testInlineEquivalence(t *testing.T, addr string, hosts int) {
	clock, script := new(l7test.ManualClock), new(l7test.ManualClock)
	clock.Set(int64(time.Hour))
	script.Set(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	newService := func(prefix string) *Service {
		_, cfg := decodeL7(t, inlinePolicy(addr, fmt.Sprintf("eg:inline:%d:%s:", hosts, prefix), hosts))
		svc, err := New(cfg, Options{Clock: clock, limiterConfig: func(c *redislimit.Config) {
			c.ScriptClock = script
			c.SyncEvery = -1 // no background flush: syncs happen where requests make them
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		return svc
	}
	inline, worker := newService("inline"), newService("worker")
	if !inline.tries {
		t.Fatal("a service with hybrid limits does not try its decisions inline")
	}

	rng := rand.New(rand.NewPCG(uint64(hosts), 26))
	kinds := map[string]int{}
	var decided, deferred int
	for i := range 1500 {
		if rng.IntN(4) == 0 {
			d := time.Duration(rng.IntN(3000)) * time.Millisecond
			clock.Advance(d)
			script.Advance(d)
		}
		req := &Request{Domain: "edge"}
		var kind string
		switch rng.IntN(5) {
		case 0:
			kind = "hybrid"
			req.Descriptors = []Descriptor{{Entries: []Entry{{"tenant", fmt.Sprint("t", rng.IntN(3))}}}}
		case 1:
			kind = "hybrid+local"
			req.Descriptors = []Descriptor{{Entries: []Entry{{"user_id", fmt.Sprint("u", rng.IntN(3))}}}}
		case 2:
			kind = "hybrid+redis"
			req.Descriptors = []Descriptor{{Entries: []Entry{{"api_key", fmt.Sprint("k", rng.IntN(2))}}}}
		case 3:
			kind = "two descriptors"
			req.Descriptors = []Descriptor{
				{Entries: []Entry{{"tenant", fmt.Sprint("t", rng.IntN(3))}}},
				{Entries: []Entry{{"user_id", fmt.Sprint("u", rng.IntN(3))}}},
			}
		default:
			kind = "hits_addend"
			req.HitsAddend = uint64(1 + rng.IntN(3))
			req.Descriptors = []Descriptor{{Entries: []Entry{{"tenant", fmt.Sprint("t", rng.IntN(3))}}}}
			if rng.IntN(2) == 0 {
				req.Descriptors[0] = Descriptor{Entries: []Entry{{"api_key", fmt.Sprint("k", rng.IntN(2))}}}
			}
		}
		kinds[kind]++
		got, done, gerr := inline.tryDecide(req)
		if done {
			decided++
		} else {
			deferred++
			got, gerr = inline.Decide(context.Background(), req)
		}
		want, werr := worker.Decide(context.Background(), req)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Fatalf("request %d (%s, inline %v): error %v, the worker's path %v", i, kind, done, gerr, werr)
		}
		if !sameVerdict(got, want) {
			t.Fatalf("request %d (%s, inline %v):\n inline path %+v\n worker path %+v", i, kind, done, got, want)
		}
	}
	t.Logf("hosts %d: %d decided inline, %d deferred to the worker's path; requests by kind %v", hosts, decided, deferred, kinds)
	if decided < 100 || deferred < 100 {
		t.Fatalf("%d inline and %d deferred of 1500: the sequence does not exercise both paths", decided, deferred)
	}
	for i := range inline.requests {
		if a, b := inline.requests[i].Load(), worker.requests[i].Load(); a != b {
			t.Errorf("requests[%d]: %d through the inline path, %d through the worker's", i, a, b)
		}
	}
	for ri, r := range inline.rules {
		for li, l := range r.all {
			for c := range l.counts {
				if a, b := l.counts[c].Load(), worker.rules[ri].all[li].counts[c].Load(); a != b {
					t.Errorf("limit %s count %d: %d through the inline path, %d through the worker's", l.Name, c, a, b)
				}
			}
		}
	}
}

// sameVerdict compares two verdicts field by field (Current points into
// each verdict's own statuses: compared by name).
func sameVerdict(a, b Verdict) bool {
	if a.Allowed != b.Allowed || a.Refused != b.Refused || a.Escalated != b.Escalated || a.Ranked != b.Ranked ||
		!reflect.DeepEqual(a.Headers, b.Headers) || len(a.Statuses) != len(b.Statuses) {
		return false
	}
	for i := range a.Statuses {
		sa, sb := a.Statuses[i], b.Statuses[i]
		if (sa.Current == nil) != (sb.Current == nil) || sa.Current != nil && sa.Current.Name != sb.Current.Name {
			return false
		}
		sa.Current, sb.Current = nil, nil
		// The keys are the same but for the Redis prefix, which is not
		// part of them.
		if !reflect.DeepEqual(sa, sb) || strings.Contains(sa.Key, "inline") {
			return false
		}
	}
	return true
}
