package rls

import (
	"bytes"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// TestCodec: responses are the same bytes as protobuf-go's for every
// response field the service sets, appended after what dst holds;
// requests are refused where protobuf-go refuses them.
func TestCodec(t *testing.T) {
	for _, n := range []int{1, 400} {
		v := &Verdict{Allowed: false}
		for i := range n {
			v.Statuses = append(v.Statuses, Status{Over: i%2 == 0, Current: &LimitStatus{Name: "ip-2", Count: 3, Per: 2 * time.Second},
				Decision: l7.Decision{Remaining: int64(i), Reset: time.Duration(i) * time.Millisecond, RetryAfter: time.Second}})
		}
		v.Headers = [][2]string{{"RateLimit-Policy", `"ip-2";q=3;w=2`}, {"Retry-After", "1"}}
		res := Response(v)
		res.ResponseHeadersToAdd = append(res.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "X", Value: "y"})
		got, err := appendResponse([]byte("head"), res)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:4]) != "head" || !bytes.Equal(got[4:], want) {
			t.Fatalf("%d statuses: vtproto bytes differ from protobuf-go's", n)
		}
		back := &rlsv3.RateLimitResponse{}
		if err := proto.Unmarshal(got[4:], back); err != nil || !proto.Equal(back, res) {
			t.Fatalf("%d statuses: round trip: %v", n, err)
		}
	}
	bad := []byte{0x0a, 0x03, 0xff, 0xfe, 0xfd} // domain: invalid UTF-8
	if err := unmarshalRequest(bad, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("a proto3 string with invalid UTF-8 was accepted")
	}
}
