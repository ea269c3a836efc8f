package rls

import (
	"bytes"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// TestVTCodec: the server's codec writes the same bytes as protobuf-go for
// every response field the service sets (small and pooled sizes), falls
// back to protobuf-go for messages without vtproto code, and refuses what
// protobuf-go refuses on the way in.
func TestVTCodec(t *testing.T) {
	c := newVTCodec()
	for _, n := range []int{1, 400} { // 400 statuses: above the pooling threshold
		v := &Verdict{Allowed: false}
		for i := range n {
			v.Statuses = append(v.Statuses, Status{Over: i%2 == 0, Current: &LimitStatus{Name: "ip-2", Count: 3, Per: 2 * time.Second},
				Decision: l7.Decision{Remaining: int64(i), Reset: time.Duration(i) * time.Millisecond, RetryAfter: time.Second}})
		}
		v.Headers = [][2]string{{"RateLimit-Policy", `"ip-2";q=3;w=2`}, {"Retry-After", "1"}}
		res := Response(v)
		res.ResponseHeadersToAdd = append(res.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "X", Value: "y"})
		got, err := c.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("%d statuses: vtproto bytes differ from protobuf-go's", n)
		}
		back := &rlsv3.RateLimitResponse{}
		if err := c.Unmarshal(got, back); err != nil || !proto.Equal(back, res) {
			t.Fatalf("%d statuses: round trip: %v", n, err)
		}
		got.Free()
	}
	w, err := c.Marshal(wrapperspb.String("plain"))
	if err != nil || !bytes.Equal(w.Materialize(), []byte{10, 5, 'p', 'l', 'a', 'i', 'n'}) {
		t.Fatalf("fallback marshal: %v %v", w.Materialize(), err)
	}
	bad := mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x03, 0xff, 0xfe, 0xfd})} // domain: invalid UTF-8
	if err := c.Unmarshal(bad, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("a proto3 string with invalid UTF-8 was accepted")
	}
}
