package rls

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// TestCodec: responses are the bytes protobuf-go writes for Envoy's
// message built from the same Verdict (responseMessage), for every field
// the service sets, its zero values and its bounds, appended after what
// dst holds; requests are refused where protobuf-go refuses them.
func TestCodec(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pers := []time.Duration{0, time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 90 * time.Second,
		time.Minute, 2 * time.Hour, 24 * time.Hour, 48 * time.Hour, 1<<63 - 1}
	durs := []time.Duration{-1500 * time.Millisecond, -1, 0, 1, time.Millisecond, 999999999, time.Second, 1500 * time.Millisecond, 50 * time.Second, 1<<63 - 1}
	counts := []int64{0, 1, 3, 1 << 31, 1<<32 - 1, 1 << 32, 1 << 62}
	remains := []int64{-5, 0, 1, 97, 1<<32 - 1, 1 << 40}
	names := []string{"", "ip-2", "ü-limit", strings.Repeat("n", 200)}
	for n := range 2000 {
		v := &Verdict{Allowed: rng.IntN(2) == 0}
		for range rng.IntN(5) {
			st := Status{Over: rng.IntN(2) == 0}
			if rng.IntN(4) > 0 {
				st.Current = &LimitStatus{Name: names[rng.IntN(len(names))], Count: counts[rng.IntN(len(counts))], Per: pers[rng.IntN(len(pers))]}
				st.Decision = l7.Decision{Allowed: rng.IntN(2) == 0, Remaining: remains[rng.IntN(len(remains))],
					Reset: durs[rng.IntN(len(durs))], RetryAfter: durs[rng.IntN(len(durs))]}
			}
			v.Statuses = append(v.Statuses, st)
		}
		for range rng.IntN(3) {
			v.Headers = append(v.Headers, [2]string{names[rng.IntN(len(names))], names[rng.IntN(len(names))]})
		}
		if n == 0 {
			v.Statuses = make([]Status, 400)
		}
		got, err := appendResponse([]byte("head"), v)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(responseMessage(v))
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:4]) != "head" || !bytes.Equal(got[4:], want) {
			t.Fatalf("verdict %+v:\n got %x\nwant %x", v, got[4:], want)
		}
		back := &rlsv3.RateLimitResponse{}
		if err := proto.Unmarshal(got[4:], back); err != nil || !proto.Equal(back, responseMessage(v)) {
			t.Fatalf("round trip: %v", err)
		}
	}
	if _, err := appendResponse(nil, &Verdict{Headers: [][2]string{{"k", "\xff"}}}); err == nil {
		t.Fatal("a header value that is not UTF-8 was written (protobuf-go refuses it)")
	}
	bad := []byte{0x0a, 0x03, 0xff, 0xfe, 0xfd} // domain: invalid UTF-8
	if err := unmarshalRequest(bad, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("a proto3 string with invalid UTF-8 was accepted")
	}
}
