package rls

import (
	"fmt"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The gRPC messages' codec. Requests are unmarshalled by protobuf-go, as
// grpc-go's proto codec does: protobuf-go's checks on hostile input
// (UTF-8 of proto3 strings, lengths) stay. Responses are written from the
// Verdict directly (appendResponse).

// unmarshalRequest decodes a request message.
func unmarshalRequest(msg []byte, in *rlsv3.RateLimitRequest) error {
	return proto.Unmarshal(msg, in)
}

// appendResponse appends v as Envoy's RateLimitResponse to dst: the
// bytes protobuf-go writes for the message (fields in number order,
// proto3 zero values left out), written without building the message
// (TestCodec holds them equal).
func appendResponse(dst []byte, v *Verdict) ([]byte, error) {
	overall := rlsv3.RateLimitResponse_OK
	if !v.Allowed {
		overall = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	dst = protowire.AppendTag(dst, 1, protowire.VarintType)
	dst = protowire.AppendVarint(dst, uint64(overall))
	for i := range v.Statuses {
		st := &v.Statuses[i]
		if c := st.Current; c != nil && !utf8.ValidString(c.Name) {
			return dst, fmt.Errorf("limit name %q is not UTF-8", c.Name)
		}
		dst = protowire.AppendTag(dst, 2, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(statusSize(st)))
		dst = appendStatus(dst, st)
	}
	for _, h := range v.Headers {
		if !utf8.ValidString(h[0]) || !utf8.ValidString(h[1]) {
			return dst, fmt.Errorf("header %q is not UTF-8", h[0])
		}
		n := stringFieldSize(1, h[0]) + stringFieldSize(2, h[1])
		dst = protowire.AppendTag(dst, 3, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(n))
		dst = appendStringField(dst, 1, h[0])
		dst = appendStringField(dst, 2, h[1])
	}
	return dst, nil
}

// statusParts are a DescriptorStatus's values.
func statusParts(st *Status) (code rlsv3.RateLimitResponse_Code, remaining uint32, reset time.Duration) {
	code = rlsv3.RateLimitResponse_OK
	if st.Over {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if st.Current != nil {
		remaining = uint32(min(max(st.Decision.Remaining, 0), 1<<32-1))
		reset = st.Decision.Reset
		if !st.Decision.Allowed {
			reset = st.Decision.RetryAfter
		}
	}
	return code, remaining, reset
}

func statusSize(st *Status) int {
	code, remaining, reset := statusParts(st)
	n := varintFieldSize(1, uint64(code))
	if c := st.Current; c != nil {
		n += messageFieldSize(2, rateLimitSize(c))
		n += varintFieldSize(3, uint64(remaining))
		n += messageFieldSize(4, durationSize(reset))
	}
	return n
}

func appendStatus(dst []byte, st *Status) []byte {
	code, remaining, reset := statusParts(st)
	dst = appendVarintField(dst, 1, uint64(code))
	c := st.Current
	if c == nil {
		return dst
	}
	dst = protowire.AppendTag(dst, 2, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(rateLimitSize(c)))
	unit, mult := limitUnit(c.Per)
	dst = appendVarintField(dst, 1, uint64(uint32(min(c.Count, 1<<32-1))))
	dst = appendVarintField(dst, 2, uint64(unit))
	dst = appendStringField(dst, 3, c.Name)
	if mult != 0 {
		dst = protowire.AppendTag(dst, 4, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(varintFieldSize(1, uint64(mult))))
		dst = appendVarintField(dst, 1, uint64(mult))
	}
	dst = appendVarintField(dst, 3, uint64(remaining))
	dst = protowire.AppendTag(dst, 4, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(durationSize(reset)))
	dst = appendVarintField(dst, 1, uint64(int64(reset/time.Second)))
	return appendVarintField(dst, 2, uint64(int64(int32(reset%time.Second))))
}

func rateLimitSize(c *LimitStatus) int {
	unit, mult := limitUnit(c.Per)
	n := varintFieldSize(1, uint64(uint32(min(c.Count, 1<<32-1)))) + varintFieldSize(2, uint64(unit)) + stringFieldSize(3, c.Name)
	if mult != 0 {
		n += messageFieldSize(4, varintFieldSize(1, uint64(mult)))
	}
	return n
}

// durationSize is a google.protobuf.Duration's (as durationpb.New).
func durationSize(d time.Duration) int {
	return varintFieldSize(1, uint64(int64(d/time.Second))) + varintFieldSize(2, uint64(int64(int32(d%time.Second))))
}

// The proto3 field helpers: a zero value is not written.

func varintFieldSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendVarintField(dst []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return dst
	}
	return protowire.AppendVarint(protowire.AppendTag(dst, num, protowire.VarintType), v)
}

func stringFieldSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func appendStringField(dst []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return dst
	}
	return protowire.AppendString(protowire.AppendTag(dst, num, protowire.BytesType), s)
}

// messageFieldSize is a present message field's (written even when empty).
func messageFieldSize(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}
