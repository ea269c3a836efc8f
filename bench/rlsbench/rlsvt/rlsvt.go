// Package rlsvt decodes Envoy's RateLimitResponse (go-control-plane's
// generated type, envoy/service/ratelimit/v3) with vtprotobuf's generated
// unmarshal code instead of protobuf-go's reflection: the load client
// (bench/rlsbench) decodes every answer, and this costs it a fifth as much
// CPU. go-control-plane ships vtproto marshal and size code only, so the
// unmarshal code is generated here (gen/) from the descriptors compiled
// into those types, in vtprotobuf's wrap mode (a local type per message,
// converted from and to Envoy's). TestMatchesProtobuf holds it equal to
// proto.Unmarshal.
package rlsvt

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

//go:generate go run ./gen

// Unmarshal decodes b into m, replacing what m held. Unlike proto.Unmarshal
// it drops unknown fields and does not check that strings are UTF-8. The
// elements of m's repeated fields are reused (reset) when m is decoded into
// again: a message decoded into over and over allocates little.
func Unmarshal(b []byte, m *rlsv3.RateLimitResponse) error {
	reset(m)
	return (*RateLimitResponse)(m).UnmarshalVT(b)
}

// UnmarshalUnsafe is Unmarshal whose strings and bytes alias b: m is valid
// only while b is unchanged.
func UnmarshalUnsafe(b []byte, m *rlsv3.RateLimitResponse) error {
	reset(m)
	return (*RateLimitResponse)(m).UnmarshalVTUnsafe(b)
}

// reset clears m but keeps its repeated fields' elements for grow.
func reset(m *rlsv3.RateLimitResponse) {
	st, rsp, req := m.Statuses[:0], m.ResponseHeadersToAdd[:0], m.RequestHeadersToAdd[:0]
	m.Reset()
	m.Statuses, m.ResponseHeadersToAdd, m.RequestHeadersToAdd = st, rsp, req
}

// grow is s with one more element: one s's array still holds, reset, or a
// new one.
func grow[P interface {
	*T
	Reset()
}, T any](s []P) []P {
	if len(s) < cap(s) {
		s = s[:len(s)+1]
		if e := s[len(s)-1]; e != nil {
			e.Reset()
			return s
		}
		s[len(s)-1] = new(T)
		return s
	}
	return append(s, P(new(T)))
}
