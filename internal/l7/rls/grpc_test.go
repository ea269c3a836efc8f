package rls

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

const fieldsPolicy = `
l7:
  client_prefix: {v4: 24}
  rls:
    listen: 127.0.0.1:0
    unix: UNIXSOCK
    rules:
      - name: per-ip
        domain: edge
        descriptor: [remote_address]
        limits:
          - {name: ip-3m, rate: 3/min, algorithm: fixed-window}
      - name: api-key
        domain: edge
        descriptor: [generic_key=api, header_key]
        limits:
          - {name: key-1h, rate: 100/h, algorithm: fixed-window}
`

// TestGRPCResponseFields checks every field of Envoy's answer over TCP and
// over the Unix socket, with Envoy's generated client.
func TestGRPCResponseFields(t *testing.T) {
	for _, transport := range []string{"tcp", "unix"} {
		t.Run(transport, func(t *testing.T) {
			clock := new(l7test.ManualClock)
			clock.Set(int64(10 * time.Second)) // 50s left in the minute's window
			s, cfg := startServer(t, fieldsPolicy, clock, nil)
			target := s.Addrs()["grpc"]
			if transport == "unix" {
				target = "unix://" + cfg.Unix
			}
			c, _ := dial(t, target)
			for i := range 3 {
				// 198.51.100.7 and .9 share the /24 key: one budget.
				addr := []string{"198.51.100.7", "198.51.100.9", "198.51.100.7"}[i]
				res := ask(t, c, "edge", desc("remote_address="+addr), desc("unmatched=x"), desc("generic_key=api", "header_key=k1"))
				if res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("request %d: overall %v, want OK", i, res.GetOverallCode())
				}
				if len(res.GetStatuses()) != 3 {
					t.Fatalf("request %d: %d statuses, want 3", i, len(res.GetStatuses()))
				}
				st := res.GetStatuses()[0]
				want := &rlsv3.RateLimitResponse_DescriptorStatus{
					Code:           rlsv3.RateLimitResponse_OK,
					CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{Name: "ip-3m", RequestsPerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
					LimitRemaining: uint32(2 - i),
				}
				if st.GetDurationUntilReset().AsDuration() != 50*time.Second {
					t.Errorf("request %d: duration_until_reset %v, want 50s", i, st.GetDurationUntilReset().AsDuration())
				}
				st.DurationUntilReset = nil
				if !proto.Equal(st, want) {
					t.Errorf("request %d: status %v, want %v", i, st, want)
				}
				if un := res.GetStatuses()[1]; !proto.Equal(un, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}) {
					t.Errorf("request %d: unmatched descriptor's status %v, want a bare OK", i, un)
				}
				k := res.GetStatuses()[2]
				wantK := &rlsv3.RateLimitResponse_RateLimit{Name: "key-1h", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}
				if !proto.Equal(k.GetCurrentLimit(), wantK) || k.GetLimitRemaining() != uint32(99-i) || k.GetDurationUntilReset().AsDuration() != 3590*time.Second {
					t.Errorf("request %d: api-key status %v, want %v remaining %d reset 3590s", i, k, wantK, 99-i)
				}
				h := headers(res)
				wantH := map[string]string{
					"RateLimit-Policy": `"ip-3m";q=3;w=60, "key-1h";q=100;w=3600`,
					"RateLimit":        fmt.Sprintf(`"ip-3m";r=%d;t=50, "key-1h";r=%d;t=3590`, 2-i, 99-i),
				}
				if fmt.Sprint(h) != fmt.Sprint(wantH) {
					t.Errorf("request %d: headers %v, want %v", i, h, wantH)
				}
				if len(res.GetRequestHeadersToAdd()) != 0 || res.GetRawBody() != nil || res.GetDynamicMetadata() != nil || res.GetQuota() != nil {
					t.Errorf("request %d: unexpected fields set: %v", i, res)
				}
			}
			// The fourth request of the /24 is refused; the api-key
			// descriptor in the same request is not charged (all or nothing).
			res := ask(t, c, "edge", desc("remote_address=198.51.100.200"), desc("unmatched=x"), desc("generic_key=api", "header_key=k1"))
			if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("4th request: overall %v, want OVER_LIMIT", res.GetOverallCode())
			}
			st := res.GetStatuses()[0]
			if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 ||
				st.GetDurationUntilReset().AsDuration() != 50*time.Second || st.GetCurrentLimit().GetName() != "ip-3m" {
				t.Errorf("4th request: status %v, want OVER_LIMIT ip-3m remaining 0 reset 50s", st)
			}
			if k := res.GetStatuses()[2]; k.GetCode() != rlsv3.RateLimitResponse_OK || k.GetLimitRemaining() != 97 {
				t.Errorf("4th request: api-key status %v, want OK with 97 remaining (uncharged)", k)
			}
			h := headers(res)
			wantH := map[string]string{
				"RateLimit-Policy": `"ip-3m";q=3;w=60, "key-1h";q=100;w=3600`,
				"RateLimit":        `"ip-3m";r=0;t=50, "key-1h";r=97;t=3590`,
				"Retry-After":      "50",
			}
			if fmt.Sprint(h) != fmt.Sprint(wantH) {
				t.Errorf("4th request: headers %v, want %v", h, wantH)
			}
			// Another /24 has its own budget; the window's end restores it.
			if res := ask(t, c, "edge", desc("remote_address=198.51.101.1")); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("another /24: %v, want OK", res.GetOverallCode())
			}
			clock.Advance(50 * time.Second)
			if res := ask(t, c, "edge", desc("remote_address=198.51.100.7")); res.GetOverallCode() != rlsv3.RateLimitResponse_OK ||
				res.GetStatuses()[0].GetLimitRemaining() != 2 {
				t.Errorf("next window: %v, want OK with 2 remaining", res)
			}
			// hits_addend: the request's, and a descriptor's own.
			res = ask(t, c, "edge", &ratelimitv3.RateLimitDescriptor{Entries: desc("generic_key=api", "header_key=k2").Entries, HitsAddend: wrapperspb.UInt64(40)})
			if got := res.GetStatuses()[0].GetLimitRemaining(); got != 60 {
				t.Errorf("hits_addend 40: remaining %d, want 60", got)
			}
			ctx := context.Background()
			res, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 61,
				Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key=api", "header_key=k2")}})
			if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || res.GetStatuses()[0].GetLimitRemaining() != 60 {
				t.Errorf("hits_addend 61 with 60 left: %v %v, want OVER_LIMIT with 60 remaining", res, err)
			}
		})
	}
}

// TestRateLimitUnit: a window is said as the largest unit that divides it
// times unit_multiplier.
func TestRateLimitUnit(t *testing.T) {
	for _, tc := range []struct {
		per  time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		mult uint32
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{10 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 10},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{2 * time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 2},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 0},
		{48 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 2},
		{500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0},
	} {
		rl := rateLimit(&LimitStatus{Name: "x", Count: 7, Per: tc.per})
		if rl.GetUnit() != tc.unit || rl.GetUnitMultiplier().GetValue() != tc.mult || rl.GetRequestsPerUnit() != 7 {
			t.Errorf("%v: %v, want unit %v multiplier %d", tc.per, rl, tc.unit, tc.mult)
		}
	}
}

// rawCodec sends bytes as they are: a request Envoy's types cannot decode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// TestGRPCMalformed: a malformed request is a gRPC error, never a panic,
// and the service keeps answering.
func TestGRPCMalformed(t *testing.T) {
	s, _ := startServer(t, fieldsPolicy, new(l7test.ManualClock), nil)
	c, cc := dial(t, s.Addrs()["grpc"])
	ctx := context.Background()
	long := make([]byte, MaxValue+1)
	for i := range long {
		long[i] = 'a'
	}
	many := make([]*ratelimitv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("remote_address=192.0.2.1")
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address=192.0.2.1")}}},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}},
		{"empty descriptor", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}},
		{"nil descriptor", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{nil}}},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("=x")}}},
		{"long value", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("unmatched=" + string(long))}}},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many}},
		{"not an address", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address=not-an-ip")}}},
		{"a valid descriptor, then not an address", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address=192.0.2.1"), desc("remote_address=not-an-ip")}}},
		{"huge hits_addend", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: desc("remote_address=192.0.2.1").Entries, HitsAddend: wrapperspb.UInt64(1 << 40)}}}},
	}
	for _, tc := range cases {
		_, err := c.ShouldRateLimit(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
	// Bytes that are no protobuf message at all.
	for _, raw := range [][]byte{{0xff, 0xff, 0xff}, {0x0a, 0x80}, {0x12, 0x05, 0x0a, 0x03}} {
		var out []byte
		err := cc.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &raw, &out, grpc.ForceCodec(rawCodec{}))
		if code := status.Code(err); code == codes.OK || code == codes.Unknown {
			t.Errorf("raw %x: %v, want a gRPC error status", raw, err)
		}
	}
	// An unknown method.
	var out []byte
	in := []byte{}
	if err := cc.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/Nope", &in, &out, grpc.ForceCodec(rawCodec{})); status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v, want Unimplemented", err)
	}
	// Nothing was charged by the malformed requests: 2 of 3 remain.
	if res := ask(t, c, "edge", desc("remote_address=192.0.2.1")); res.GetOverallCode() != rlsv3.RateLimitResponse_OK ||
		res.GetStatuses()[0].GetLimitRemaining() != 2 {
		t.Errorf("after the malformed requests: %v, want OK with 2 remaining", res)
	}
}

// TestGRPCConcurrentStreams: many streams on one connection and several
// connections decide one budget exactly.
func TestGRPCConcurrentStreams(t *testing.T) {
	const policy = `
l7:
  rls:
    unix: UNIXSOCK
    listen: 127.0.0.1:0
    rules:
      - name: global
        domain: edge
        descriptor: [generic_key=all]
        limits:
          - {name: all-500, rate: 500/min, algorithm: sliding-window}
`
	s, cfg := startServer(t, policy, new(l7test.ManualClock), nil)
	targets := []string{s.Addrs()["grpc"], "unix://" + cfg.Unix}
	const workers, each = 16, 60 // 960 requests for 500
	var ok, over atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		c, _ := dial(t, targets[w%2])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				res, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("generic_key=all")}})
				if err != nil {
					errs <- err
					return
				}
				if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				} else {
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ok.Load() != 500 || over.Load() != workers*each-500 {
		t.Errorf("%d OK and %d OVER_LIMIT of %d, want exactly 500 OK", ok.Load(), over.Load(), workers*each)
	}
	t.Logf("%d streams over TCP and the Unix socket: %d OK, %d OVER_LIMIT (exact)", workers, ok.Load(), over.Load())
}

// TestReloadUnderLoad: reloads while clients ask never fail a request, and
// the new limits apply from the commit on.
func TestReloadUnderLoad(t *testing.T) {
	policy := func(n int) string {
		return fmt.Sprintf(`
l7:
  rls:
    listen: 127.0.0.1:0
    unix: /tmp/unused-replaced
    rules:
      - name: per-ip
        domain: edge
        descriptor: [remote_address]
        limits:
          - {name: gen-%d, rate: 1000000/min}
`, n)
	}
	sock := t.TempDir() + "/rls.sock"
	src := func(n int) string { return replaceUnix(policy(n), sock) }
	s, _ := startServer(t, src(0), nil, nil)
	addr := s.Addrs()["grpc"]
	c, _ := dial(t, addr)
	cu, _ := dial(t, "unix://"+sock)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered atomic.Int64
	failures := make(chan error, 8)
	for w := range 4 {
		cl := c
		if w%2 == 1 {
			cl = cu
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res, err := cl.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(fmt.Sprintf("remote_address=192.0.2.%d", i%250))}})
				if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					failures <- fmt.Errorf("during reloads: %v %v", res, err)
					return
				}
				answered.Add(1)
			}
		}()
	}
	for n := 1; n <= 20; n++ {
		time.Sleep(10 * time.Millisecond)
		reload(t, s, src(n))
		if got := s.Addrs()["grpc"]; got != addr {
			t.Fatalf("reload %d moved the listener from %s to %s", n, addr, got)
		}
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	res := ask(t, c, "edge", desc("remote_address=192.0.2.1"))
	if got := res.GetStatuses()[0].GetCurrentLimit().GetName(); got != "gen-20" {
		t.Errorf("after the last reload the limit is %q, want gen-20", got)
	}
	if answered.Load() == 0 {
		t.Fatal("no request was answered during the reloads")
	}
	t.Logf("%d requests answered across 20 reloads, none failed", answered.Load())
	// A reload that cannot bind changes nothing.
	bad := strings.Replace(src(21), "listen: 127.0.0.1:0", "listen: 192.0.2.1:1", 1)
	_, cfg := decodeL7(t, bad)
	if _, err := s.Prepare(cfg); err == nil {
		t.Fatal("a reload onto an address this host does not have succeeded")
	}
	if res := ask(t, c, "edge", desc("remote_address=192.0.2.1")); res.GetStatuses()[0].GetCurrentLimit().GetName() != "gen-20" {
		t.Errorf("a failed reload changed the limits: %v", res)
	}
}

// TestReloadKeepsState: a reload whose rls configuration is unchanged (the
// policy changed elsewhere) keeps the limits' state; a changed one starts
// them afresh, as the proxy's routes.
func TestReloadKeepsState(t *testing.T) {
	sock := t.TempDir() + "/rls.sock"
	src := replaceUnix(fieldsPolicy, "UNIXSOCK")
	src = strings.Replace(src, "unix: UNIXSOCK", "unix: "+sock, 1)
	s, _ := startServer(t, src, nil, nil)
	c, _ := dial(t, s.Addrs()["grpc"])
	for range 2 {
		ask(t, c, "edge", desc("remote_address=192.0.2.1"))
	}
	reload(t, s, src)
	if got := ask(t, c, "edge", desc("remote_address=192.0.2.1")).GetStatuses()[0].GetLimitRemaining(); got != 0 {
		t.Errorf("after an unchanged reload: %d remaining, want 0 (state kept)", got)
	}
	reload(t, s, strings.Replace(src, "rate: 3/min", "rate: 4/min", 1))
	if got := ask(t, c, "edge", desc("remote_address=192.0.2.1")).GetStatuses()[0].GetLimitRemaining(); got != 3 {
		t.Errorf("after a changed reload: %d remaining, want 3 (a new limit)", got)
	}
}
