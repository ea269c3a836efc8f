package rlsvt

import (
	"math/rand/v2"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// randomResponse fills every field of a RateLimitResponse some of the
// time, with random values.
func randomResponse(rng *rand.Rand) *rlsv3.RateLimitResponse {
	str := func() string {
		b := make([]byte, rng.IntN(20))
		for i := range b {
			b[i] = byte('a' + rng.IntN(26))
		}
		return string(b)
	}
	headers := func() []*corev3.HeaderValue {
		var hs []*corev3.HeaderValue
		for range rng.IntN(4) {
			h := &corev3.HeaderValue{Key: str(), Value: str()}
			if rng.IntN(4) == 0 {
				h.RawValue = []byte(str())
			}
			hs = append(hs, h)
		}
		return hs
	}
	m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(rng.IntN(3)),
		ResponseHeadersToAdd: headers(), RequestHeadersToAdd: headers()}
	for range rng.IntN(4) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(rng.IntN(3)),
			LimitRemaining: rng.Uint32()}
		if rng.IntN(2) == 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: str(), RequestsPerUnit: rng.Uint32(),
				Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rng.IntN(7))}
		}
		if rng.IntN(2) == 0 {
			st.DurationUntilReset = durationpb.New(time.Duration(rng.Int64N(int64(time.Hour))))
		}
		if rng.IntN(3) == 0 {
			q := &rlsv3.RateLimitResponse_Quota{Requests: rng.Uint32(), Id: str()}
			if rng.IntN(2) == 0 {
				q.ExpirationSpecifier = &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(time.Unix(rng.Int64N(1<<31), 0))}
			}
			st.Quota = q
		}
		m.Statuses = append(m.Statuses, st)
	}
	if rng.IntN(3) == 0 {
		m.RawBody = []byte(str())
	}
	if rng.IntN(3) == 0 {
		m.DynamicMetadata, _ = structpb.NewStruct(map[string]any{str(): str(), "n": float64(rng.IntN(100))})
	}
	if rng.IntN(3) == 0 {
		m.Quota = &rlsv3.RateLimitResponse_Quota{Requests: rng.Uint32()}
	}
	return m
}

// The generated decoder gives what protobuf-go gives, for every field, and
// fails where protobuf-go fails on truncated input.
func TestMatchesProtobuf(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 11))
	var got rlsv3.RateLimitResponse
	got.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT // replaced, not merged
	got.Statuses = []*rlsv3.RateLimitResponse_DescriptorStatus{{}}
	for i := range 2000 {
		m := randomResponse(rng)
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		for name, dec := range map[string]func([]byte, *rlsv3.RateLimitResponse) error{"safe": Unmarshal, "unsafe": UnmarshalUnsafe} {
			if err := dec(b, &got); err != nil {
				t.Fatalf("message %d (%s): %v", i, name, err)
			}
			if !proto.Equal(&got, m) {
				t.Fatalf("message %d (%s): decoded\n%v\nwant\n%v", i, name, &got, m)
			}
		}
		if len(b) > 0 {
			cut := b[:rng.IntN(len(b))]
			var want rlsv3.RateLimitResponse
			perr := proto.Unmarshal(cut, &want)
			verr := Unmarshal(cut, &got)
			if (perr == nil) != (verr == nil) {
				t.Fatalf("message %d cut at %d/%d: protobuf-go %v, vtproto %v", i, len(cut), len(b), perr, verr)
			}
			if verr == nil && !proto.Equal(&got, &want) {
				t.Fatalf("message %d cut at %d/%d: decoded %v, protobuf-go %v", i, len(cut), len(b), &got, &want)
			}
		}
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "ip-2", RequestsPerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			DurationUntilReset: durationpb.New(300 * time.Millisecond)}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "ratelimit-policy", Value: `"ip-2";q=2;w=1`},
			{Key: "ratelimit", Value: `"ip-2";r=0;t=1`}, {Key: "retry-after", Value: "1"}}}
	raw, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	var out rlsv3.RateLimitResponse
	b.Run("vtproto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := Unmarshal(raw, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("vtproto-unsafe", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := UnmarshalUnsafe(raw, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(raw, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
