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
	req := []string{":method", "POST", ":path", "/a.B/C", "content-type", "application/grpc"}
	first := block(req...) // indexes the fields: not neutral
	if tableNeutral(first) {
		t.Fatal("a block with incremental indexing is neutral")
	}
	h, err := d.decode(first)
	if err != nil || h.path != "/a.B/C" || h.method != "POST" || d.lastOK {
		t.Fatalf("first: %+v %v cached %v", h, err, d.lastOK)
	}
	indexed := block(req...) // the dynamic table's entries: neutral
	if !tableNeutral(indexed) {
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
	if h, _ = d.decode(block(":method", "POST", ":path", "/x.Y/Z", "content-type", "application/grpc")); h.path != "/x.Y/Z" || d.lastOK {
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
		{[]string{":method", "POST"}, "no :method or :path"},
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
