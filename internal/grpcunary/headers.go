package grpcunary

import (
	"bytes"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
)

// reqHeaders is what the server reads of a request's header list.
type reqHeaders struct {
	method, path, ctype, timeout, encoding string
	contentLength                          int64 // -1: none
	// truncated: the list is over MaxHeaderListSize (RFC 9113 §6.5.2
	// sizes); what follows the bound was decoded for HPACK's state only.
	truncated bool
	// invalid says why the list is malformed (RFC 9113 §8.2, §8.3): the
	// stream is reset with PROTOCOL_ERROR.
	invalid string
}

// headerDecoder decodes a connection's request header blocks (one HPACK
// decoder per connection, as its dynamic table is). A block that leaves
// the dynamic table as it was (only indexed fields, literals without
// indexing and size updates to the size the table has) means the same
// while the table does not change: the last such block and what it held
// are kept, and the same bytes again are not decoded again. Clients send
// the same block for every call of one method (Envoy's indexed fields,
// or literals without indexing).
type headerDecoder struct {
	dec  *hpack.Decoder
	max  uint32
	cur  reqHeaders
	size uint32
	seen uint8 // pseudo-header fields seen (bits), and a regular one (bit 7)

	last   []byte
	lastH  reqHeaders
	lastOK bool
	// tableSize is the dynamic table's maximum size (size updates
	// decoded so far; SETTINGS_HEADER_TABLE_SIZE's default before).
	tableSize uint64
}

func newHeaderDecoder(max uint32) *headerDecoder {
	d := &headerDecoder{max: max, tableSize: 4096}
	d.dec = hpack.NewDecoder(4096, d.emit)
	d.dec.SetMaxStringLength(int(max))
	return d
}

// decode decodes one whole header block; an error is a connection error
// (COMPRESSION_ERROR).
func (d *headerDecoder) decode(block []byte) (reqHeaders, error) {
	if d.lastOK && bytes.Equal(block, d.last) {
		return d.lastH, nil
	}
	d.cur, d.size, d.seen = reqHeaders{contentLength: -1}, 0, 0
	d.dec.SetEmitEnabled(true)
	if _, err := d.dec.Write(block); err != nil {
		return reqHeaders{}, err
	}
	if err := d.dec.Close(); err != nil {
		return reqHeaders{}, err
	}
	h := d.cur
	if d.seen&(1<<pMethod) == 0 || d.seen&(1<<pPath) == 0 || d.seen&(1<<pScheme) == 0 || h.path == "" {
		if h.invalid == "" && !h.truncated {
			h.invalid = "no :method, :scheme or :path" // RFC 9113 §8.3.1
		}
	}
	neutral, size := tableNeutral(block, d.tableSize)
	d.tableSize = size
	switch {
	case !neutral:
		d.lastOK = false
	case h.invalid == "" && !h.truncated:
		d.last, d.lastH, d.lastOK = append(d.last[:0], block...), h, true
	}
	return h, nil
}

const (
	pMethod = iota
	pPath
	pScheme
	pAuthority
	pRegular = 7
)

func (d *headerDecoder) emit(f hpack.HeaderField) {
	h := &d.cur
	if h.invalid != "" || h.truncated {
		return
	}
	if d.size += f.Size(); d.size > d.max {
		h.truncated = true
		d.dec.SetEmitEnabled(false)
		return
	}
	if strings.HasPrefix(f.Name, ":") {
		var bit uint8
		switch f.Name {
		case ":method":
			bit, h.method = pMethod, f.Value
		case ":path":
			bit, h.path = pPath, f.Value
		case ":scheme":
			bit = pScheme
		case ":authority":
			bit = pAuthority
		default:
			h.invalid = "pseudo-header " + f.Name + " in a request"
			return
		}
		switch {
		case d.seen&(1<<pRegular) != 0:
			h.invalid = "a pseudo-header after a regular header"
		case d.seen&(1<<bit) != 0:
			h.invalid = "pseudo-header " + f.Name + " twice"
		}
		d.seen |= 1 << bit
		return
	}
	d.seen |= 1 << pRegular
	if !validName(f.Name) || !httpguts.ValidHeaderFieldValue(f.Value) {
		h.invalid = "an invalid header field"
		return
	}
	switch f.Name {
	case "content-type":
		h.ctype = f.Value
	case "grpc-timeout":
		h.timeout = f.Value
	case "grpc-encoding":
		h.encoding = f.Value
	case "content-length":
		n, err := strconv.ParseInt(f.Value, 10, 64)
		if err != nil || n < 0 || h.contentLength >= 0 || f.Value[0] == '+' {
			h.invalid = "a malformed or repeated content-length"
			return
		}
		h.contentLength = n
	case "te":
		if f.Value != "trailers" {
			h.invalid = "te other than trailers"
		}
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		h.invalid = "connection-specific header " + f.Name // RFC 9113 §8.2.2
	}
}

// validName: a token in lower case (RFC 9113 §8.2.1).
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return true
}

// tableNeutral reports whether an HPACK block (decoded without error)
// leaves the dynamic table as it was: indexed fields, literals without
// (or never) indexing, and size updates to the size the table has (RFC
// 7541 §6); and the table's size after it.
func tableNeutral(b []byte, size uint64) (bool, uint64) {
	neutral := true
	for len(b) > 0 {
		c := b[0]
		var ok bool
		switch {
		case c&0x80 != 0: // indexed
			_, b, ok = hpackInt(7, b)
		case c&0xc0 == 0x40: // incremental indexing
			return false, size
		case c&0xe0 == 0x20: // size update
			var v uint64
			if v, b, ok = hpackInt(5, b); ok && v != size {
				neutral, size = false, v
			}
		default: // without indexing (0000), never indexed (0001)
			var idx uint64
			if idx, b, ok = hpackInt(4, b); ok && idx == 0 {
				b, ok = skipHpackString(b)
			}
			if ok {
				b, ok = skipHpackString(b)
			}
		}
		if !ok {
			return false, size
		}
	}
	return neutral, size
}

// hpackInt reads an integer with an n-bit prefix (RFC 7541 §5.1).
func hpackInt(n uint, b []byte) (uint64, []byte, bool) {
	if len(b) == 0 {
		return 0, b, false
	}
	k := uint64(1)<<n - 1
	v := uint64(b[0]) & k
	b = b[1:]
	if v < k {
		return v, b, true
	}
	for m := uint(0); m < 63; m += 7 {
		if len(b) == 0 {
			return 0, b, false
		}
		c := b[0]
		b = b[1:]
		v += uint64(c&127) << m
		if c&128 == 0 {
			return v, b, true
		}
	}
	return 0, b, false
}

func skipHpackString(b []byte) ([]byte, bool) {
	n, b, ok := hpackInt(7, b)
	if !ok || n > uint64(len(b)) {
		return b, false
	}
	return b[n:], true
}
