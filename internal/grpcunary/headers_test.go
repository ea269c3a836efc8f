package grpcunary

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// TestHeaderDecoderCache: a block that leaves HPACK's dynamic table as it
// was is decoded once and remembered; the same bytes after the table
// changed are decoded again (they may mean other fields now).
func TestHeaderDecoderCache(t *testing.T) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	block := func(fields ...string) []byte {
		buf.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return bytes.Clone(buf.Bytes())
	}
	d := newHeaderDecoder(4096)
	req := []string{":method", "POST", ":scheme", "http", ":path", "/a.B/C", "content-type", "application/grpc"}
	first := block(req...) // indexes the fields: not neutral
	if ok, _ := tableNeutral(first, 4096); ok {
		t.Fatal("a block with incremental indexing is neutral")
	}
	h, err := d.decode(first)
	if err != nil || h.path != "/a.B/C" || h.method != "POST" || d.lastOK {
		t.Fatalf("first: %+v %v cached %v", h, err, d.lastOK)
	}
	indexed := block(req...) // the dynamic table's entries: neutral
	if ok, _ := tableNeutral(indexed, 4096); !ok {
		t.Fatalf("an all-indexed block %x is not neutral", indexed)
	}
	if h, err = d.decode(indexed); err != nil || h.path != "/a.B/C" || !d.lastOK {
		t.Fatalf("indexed: %+v %v cached %v", h, err, d.lastOK)
	}
	if h, _ = d.decode(indexed); h.path != "/a.B/C" {
		t.Fatalf("indexed again (cached): %+v", h)
	}
	// Another path is indexed: the entries move by one, so the same
	// indexed bytes now name other fields.
	if h, _ = d.decode(block(":method", "POST", ":scheme", "http", ":path", "/x.Y/Z", "content-type", "application/grpc")); h.path != "/x.Y/Z" || d.lastOK {
		t.Fatalf("a new path: %+v cached %v", h, d.lastOK)
	}
	h, err = d.decode(indexed)
	if err != nil {
		t.Fatal(err)
	}
	if h.path == "/a.B/C" && h.ctype == "application/grpc" && h.method == "POST" {
		t.Fatalf("the old indexed bytes after the table changed still read as the old fields: %+v", h)
	}
	t.Logf("the old bytes under the new table: %+v", h)
	// Size updates: to the size the table has, neutral; to another, not.
	for _, tc := range []struct {
		block   []byte
		size    uint64
		neutral bool
		after   uint64
	}{
		{[]byte{0x20, 0x82}, 0, true, 0},
		{[]byte{0x20, 0x82}, 4096, false, 0},
		{[]byte{0x3f, 0xe1, 0x1f, 0x82}, 4096, true, 4096},
		{[]byte{0x3f, 0xe1, 0x1f, 0x82}, 100, false, 4096},
	} {
		if n, after := tableNeutral(tc.block, tc.size); n != tc.neutral || after != tc.after {
			t.Errorf("%x at size %d: neutral %v size %d, want %v %d", tc.block, tc.size, n, after, tc.neutral, tc.after)
		}
	}
	// A client that sets its table to 0 and sends that update with every
	// block (bench/rlsbench's h2 client): remembered after the first.
	var b0 bytes.Buffer
	e0 := hpack.NewEncoder(&b0)
	e0.SetMaxDynamicTableSizeLimit(0)
	_ = e0.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
	_ = e0.WriteField(hpack.HeaderField{Name: ":scheme", Value: "http"})
	_ = e0.WriteField(hpack.HeaderField{Name: ":path", Value: "/a.B/C"})
	d0 := newHeaderDecoder(4096)
	for i := range 3 {
		if h, err := d0.decode(b0.Bytes()); err != nil || h.path != "/a.B/C" || d0.lastOK != (i > 0) {
			t.Fatalf("size-0 client, block %d: %+v %v cached %v", i, h, err, d0.lastOK)
		}
	}
	// Malformed lists.
	enc2 := hpack.NewEncoder(&buf)
	for _, tc := range []struct {
		fields []string
		want   string
	}{
		{[]string{":method", "POST", "x", "1", ":path", "/a"}, "a pseudo-header after a regular header"},
		{[]string{":method", "POST", ":path", "/a", ":path", "/b"}, "pseudo-header :path twice"},
		{[]string{":method", "POST", ":path", "/a", ":status", "200"}, "pseudo-header :status in a request"},
		{[]string{":method", "POST", ":path", "/a", "connection", "close"}, "connection-specific header connection"},
		{[]string{":method", "POST", ":path", "/a", "te", "gzip"}, "te other than trailers"},
		{[]string{":method", "POST", ":path", "/a", "X-Up", "1"}, "an invalid header field"},
		{[]string{":method", "POST", ":path", "/a", "x", "a\x00b"}, "an invalid header field"},
		{[]string{":method", "POST", ":scheme", "http"}, "no :method, :scheme or :path"},
		{[]string{":method", "POST", ":path", "/a"}, "no :method, :scheme or :path"},
		{[]string{":method", "POST", ":scheme", "http", ":path", ""}, "no :method, :scheme or :path"},
		{[]string{":method", "POST", ":scheme", "http", ":path", "/a", "content-length", "+5"}, "a malformed or repeated content-length"},
		{[]string{":method", "POST", ":scheme", "http", ":path", "/a", "content-length", "5", "content-length", "5"}, "a malformed or repeated content-length"},
	} {
		buf.Reset()
		for i := 0; i+1 < len(tc.fields); i += 2 {
			_ = enc2.WriteField(hpack.HeaderField{Name: tc.fields[i], Value: tc.fields[i+1], Sensitive: true})
		}
		d := newHeaderDecoder(4096)
		if h, err := d.decode(buf.Bytes()); err != nil || h.invalid != tc.want {
			t.Errorf("%q: %q %v, want %q", tc.fields, h.invalid, err, tc.want)
		}
	}
}
