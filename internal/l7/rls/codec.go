package rls

import (
	"fmt"
	"slices"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// The gRPC messages' codec. Responses are marshalled by the vtprotobuf
// code go-control-plane ships beside Envoy's types when the build has it
// (rls_vtproto.pb.go, build tag vtprotobuf: generated, reflection-free,
// the same wire bytes), by protobuf-go otherwise.
// Requests are unmarshalled by protobuf-go, as grpc-go's proto codec
// does: the envoy module ships no vtproto unmarshaller, and protobuf-go's
// checks on hostile input (UTF-8 of proto3 strings, lengths) stay.

// unmarshalRequest decodes a request message.
func unmarshalRequest(msg []byte, in *rlsv3.RateLimitRequest) error {
	return proto.Unmarshal(msg, in)
}

// vtMarshaler is what rls_vtproto.pb.go adds to a message.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict([]byte) (int, error)
}

// appendResponse appends res's wire bytes to dst.
func appendResponse(dst []byte, res *rlsv3.RateLimitResponse) ([]byte, error) {
	m, ok := any(res).(vtMarshaler)
	if !ok {
		out, err := proto.MarshalOptions{}.MarshalAppend(dst, res)
		if err != nil {
			return dst, fmt.Errorf("marshal %T: %w", res, err)
		}
		return out, nil
	}
	size := m.SizeVT()
	dst = slices.Grow(dst, size)
	if _, err := m.MarshalToSizedBufferVTStrict(dst[len(dst) : len(dst)+size]); err != nil {
		return dst, fmt.Errorf("marshal %T: %w", res, err)
	}
	return dst[:len(dst)+size], nil
}
