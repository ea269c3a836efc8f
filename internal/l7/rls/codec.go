package rls

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// vtCodec is gRPC's "proto" codec with the responses marshalled by the
// vtprotobuf code go-control-plane ships beside Envoy's types
// (rls_vtproto.pb.go: generated, reflection-free, the same wire bytes).
// Requests are unmarshalled by protobuf-go, as before: the envoy module
// ships no vtproto unmarshaller, and protobuf-go's checks on hostile input
// (UTF-8 of proto3 strings, lengths) stay as they were.
type vtCodec struct{ proto encoding.CodecV2 }

// vtMarshaler is what rls_vtproto.pb.go adds to a message.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict([]byte) (int, error)
}

func newVTCodec() vtCodec { return vtCodec{proto: encoding.GetCodecV2(proto.Name)} }

func (c vtCodec) Name() string { return proto.Name }

func (c vtCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.proto.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(buf); err != nil {
			return nil, fmt.Errorf("marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict(*buf); err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("marshal %T: %w", v, err)
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c vtCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
