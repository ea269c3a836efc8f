package grpcunary

import (
	"strconv"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// The header blocks the server sends are HPACK without the dynamic table
// (indexed static entries and literals without indexing, RFC 7541 §6.1,
// §6.2.2): the same bytes on every connection, so they are built once,
// and the client's SETTINGS_HEADER_TABLE_SIZE never matters.

// appendFrameHeader appends an HTTP/2 frame header (RFC 9113 §4.1).
func appendFrameHeader(b []byte, length int, typ http2.FrameType, flags http2.Flags, id uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(typ), byte(flags),
		byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id))
}

// appendInt appends an HPACK integer with an n-bit prefix (RFC 7541 §5.1),
// the prefix's high bits being first.
func appendInt(b []byte, first byte, n uint, v uint64) []byte {
	k := uint64(1)<<n - 1
	if v < k {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(k))
	v -= k
	for v >= 128 {
		b = append(b, byte(v%128)|0x80)
		v /= 128
	}
	return append(b, byte(v))
}

// appendString appends an HPACK string literal, not Huffman-coded.
func appendString(b []byte, s string) []byte {
	b = appendInt(b, 0, 7, uint64(len(s)))
	return append(b, s...)
}

// appendLiteral appends a header field as a literal without indexing
// with a literal name (RFC 7541 §6.2.2).
func appendLiteral(b []byte, name, value string) []byte {
	b = append(b, 0)
	return appendString(appendString(b, name), value)
}

// Static table indexes (RFC 7541 Appendix A).
const (
	staticStatus200   = 8
	staticStatus      = 8 // :status (as a name)
	staticContentType = 31
)

// appendStatus appends :status code (indexed for 200).
func appendStatus(b []byte, httpStatus int) []byte {
	if httpStatus == 200 {
		return appendInt(b, 0x80, 7, staticStatus200)
	}
	b = appendInt(b, 0, 4, staticStatus)
	return appendString(b, strconv.Itoa(httpStatus))
}

func appendContentType(b []byte) []byte {
	b = appendInt(b, 0, 4, staticContentType)
	return appendString(b, "application/grpc")
}

var (
	// headersOK is a response's HEADERS block.
	headersOK = appendContentType(appendStatus(nil, 200))
	// trailersOK is an answered call's trailers.
	trailersOK = appendLiteral(nil, "grpc-status", "0")
)

// appendStatusBlock appends a Trailers-Only response's block (RFC: the
// gRPC over HTTP2 protocol): :status, content-type, grpc-status,
// grpc-message.
func appendStatusBlock(b []byte, httpStatus int, code codes.Code, msg string) []byte {
	b = appendContentType(appendStatus(b, httpStatus))
	b = appendLiteral(b, "grpc-status", strconv.Itoa(int(code)))
	if msg != "" {
		b = appendLiteral(b, "grpc-message", encodeMessage(msg))
	}
	return b
}

// encodeMessage percent-encodes a grpc-message (the gRPC protocol: bytes
// outside 0x20-0x7E and '%'), truncated to maxStatusMessage bytes.
func encodeMessage(msg string) string {
	if len(msg) > maxStatusMessage {
		msg = msg[:maxStatusMessage]
	}
	plain := true
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			plain = false
			break
		}
	}
	if plain {
		return msg
	}
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(msg)+16)
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			out = append(out, '%', hex[c>>4], hex[c&15])
		} else {
			out = append(out, c)
		}
	}
	return string(out)
}
