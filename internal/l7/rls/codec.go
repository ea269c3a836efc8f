package rls

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// The gRPC messages' codec: requests are read from their wire bytes into
// a Request (decodeRequest), responses written from the Verdict
// (appendResponse), both as protobuf-go reads and writes Envoy's messages.

// errRequest is a request message that is not Envoy's RateLimitRequest
// (what protobuf-go refuses).
var errRequest = errors.New("not a RateLimitRequest")

// decodeRequest decodes Envoy's RateLimitRequest from its wire bytes into
// req, as protobuf-go would decode the message (proto3: the last value of
// a scalar field wins, a message field seen twice is merged, strings must
// be UTF-8, unknown fields and known ones of another wire type are
// skipped) and the service reads it (TestDecodeRequest holds the two
// equal). The strings share one copy of msg.
func decodeRequest(msg []byte, req *Request) error {
	all := string(msg)
	at := func(b []byte) string { // b is a subslice of msg: its offset is what cap lost
		off := cap(msg) - cap(b)
		return all[off : off+len(b)]
	}
	*req = Request{}
	err := eachField(msg, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			if !utf8.Valid(b) {
				return errRequest
			}
			req.Domain = at(b)
		case num == 2 && typ == protowire.BytesType:
			var d Descriptor
			if err := readDescriptor(b, &d, at); err != nil {
				return err
			}
			req.Descriptors = append(req.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			req.HitsAddend = uint64(uint32(v))
		}
		return nil
	})
	if err != nil {
		*req = Request{}
	}
	return err
}

func readDescriptor(msg []byte, d *Descriptor, at func([]byte) string) error {
	return eachField(msg, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1: // entries
			var e Entry
			err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
				if typ != protowire.BytesType || num != 1 && num != 2 {
					return nil
				}
				if !utf8.Valid(b) {
					return errRequest
				}
				if num == 1 {
					e.Key = at(b)
				} else {
					e.Value = at(b)
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case 2: // limit (RateLimitOverride): ignored, but it must be a message
			return eachField(b, func(protowire.Number, protowire.Type, uint64, []byte) error { return nil })
		case 3: // hits_addend (UInt64Value), merged
			d.HasHits = true
			return eachField(b, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
				if num == 1 && typ == protowire.VarintType {
					d.Hits = v
				}
				return nil
			})
		}
		return nil
	})
}

// eachField calls f for each field of a message: a varint's value, or a
// length-delimited field's bytes; other wire types are checked and
// skipped.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || !num.IsValid() {
			return errRequest
		}
		b = b[n:]
		var v uint64
		var val []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			val, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errRequest
		}
		b = b[n:]
		if err := f(num, typ, v, val); err != nil {
			return err
		}
	}
	return nil
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
		var unit rlsv3.RateLimitResponse_RateLimit_Unit
		var mult uint32
		if st.Current != nil {
			unit, mult = limitUnit(st.Current.Per)
		}
		dst = protowire.AppendVarint(dst, uint64(statusSize(st, unit, mult)))
		dst = appendStatus(dst, st, unit, mult)
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

func statusSize(st *Status, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) int {
	code, remaining, reset := statusParts(st)
	n := varintFieldSize(1, uint64(code))
	if c := st.Current; c != nil {
		n += messageFieldSize(2, rateLimitSize(c, unit, mult))
		n += varintFieldSize(3, uint64(remaining))
		n += messageFieldSize(4, durationSize(reset))
	}
	return n
}

// appendStatus appends a DescriptorStatus (unit and mult: its limit's
// window, limitUnit's).
func appendStatus(dst []byte, st *Status, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) []byte {
	code, remaining, reset := statusParts(st)
	dst = appendVarintField(dst, 1, uint64(code))
	c := st.Current
	if c == nil {
		return dst
	}
	dst = protowire.AppendTag(dst, 2, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(rateLimitSize(c, unit, mult)))
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

func rateLimitSize(c *LimitStatus, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) int {
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
