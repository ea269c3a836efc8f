package eventloop

// The parsers are checked against net/http's own: for any input, both must
// accept it and agree on what it says, or both must reject it, unless the
// input hits one of these deliberate differences, each recognised precisely
// below (by our error's reason plus what net/http parsed, or by rewriting the
// input and comparing the rest):
//
// Request heads (net/http: the readRequest behind http.ReadRequest plus the
// checks its server makes right after, server.go conn.readRequest):
//  1. Leading empty lines: we skip up to 4 before the request line (RFC 9112
//     2.2 robustness); net/http's ReadRequest skips none. Compared after them.
//  2. Versions other than HTTP/1.0 and HTTP/1.1 are 505; net/http serves any
//     HTTP/1.x and "PRI * HTTP/2.0". Forwarding HTTP/1.7 framing as 1.1 would
//     be a guess.
//  3. obs-fold is 400 (502 in responses); net/http unfolds. Unfolding would
//     change the bytes a proxy forwards, and RFC 9112 5.2 allows rejecting it.
//  4. Transfer-Encoding with Content-Length is 400; net/http drops the
//     Content-Length. RFC 9112 6.1 calls it a likely smuggling attempt.
//  5. Transfer-Encoding in an HTTP/1.0 request is 400; net/http ignores the
//     Transfer-Encoding, so two hops could frame the body differently.
//  6. More than 128 header fields is 431; ReadRequest has no count limit.
//  7. The request target is only checked for bytes (non-empty, no CTL, no
//     space); net/http also parses it with url.ParseRequestURI. The proxy
//     forwards it as it is. Compared with the target replaced by "/". An
//     empty target is 400; net/http takes one for CONNECT.
//  8. CONNECT without Host in HTTP/1.1 is 400 (RFC 9112 3.2); net/http's
//     server lets CONNECT through without one.
//
// Response heads (net/http: http.ReadResponse), with 2, 3 and 6 above:
//  9. Status codes below 100 ("099", or "+99" which strconv.Atoi reads as 99)
//     are 502; net/http accepts any three characters Atoi reads as >= 0.
//  10. Transfer codings: like net/http, only a lone "chunked" (any case) is
//     accepted. An HTTP/1.0 response with Transfer-Encoding is 502 (faulty
//     framing, RFC 9112 6.1); net/http ignores the Transfer-Encoding.
//  11. Whitespace before a field's colon is 502; net/http's client keeps
//     such a field (go.dev/issue/34540). RFC 9112 5.1 has a proxy remove it.
//  12. A reason phrase with CTLs (other than HTAB) is 502; net/http does not
//     look at the reason phrase.
//
// Chunked bodies (net/http: the body of a chunked request read to its end,
// trailers included, with the default 4 KiB bufio.Reader):
//  13. Trailer lines end in CRLF and follow the header field rules (no
//     obs-fold, no whitespace before the colon); net/http parses trailers
//     with textproto, which accepts a bare LF, obs-fold and such names. The
//     proxy forwards the trailer bytes, so they must be as unambiguous as
//     the head.
//  14. The trailer section may be up to 64 KiB (8 KiB a line); net/http
//     rejects a trailer section it cannot see the end of in its 4 KiB buffer.
//  15. Chunk extensions must not hold CTLs other than HTAB; net/http skips
//     extensions unread.
//  16. A trailer field that frames, routes, names connection options or
//     says who forwarded (Content-Length, Host, X-Forwarded-For, ...:
//     refusedTrailer) is refused; net/http reads any name into Trailer.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/textproto"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	_ "unsafe" // for go:linkname
)

func FuzzParseRequestHead(f *testing.F) {
	for _, tc := range requestCases() {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkRequestHeadInvariants(t, in)
		compareRequestWithNetHTTP(t, in)
	})
}

func FuzzParseResponseHead(f *testing.F) {
	for _, tc := range responseCases() {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		compareResponseWithNetHTTP(t, in)
	})
}

func FuzzChunkedScanner(f *testing.F) {
	for i, tc := range chunkedCases() {
		// The table's 4 KiB lines and 64 KiB trailer sections stay out:
		// minimizing what the fuzzer grows from them takes its whole minute.
		// The table and differential tests cover those limits.
		if len(tc.in) <= 1024 {
			f.Add([]byte(tc.in), uint64(i))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, splitSeed uint64) {
		compareChunkedWithNetHTTP(t, body, splitSeed)
	})
}

// checkRequestHeadInvariants checks what must hold whatever net/http says: an
// accepted head parses the same without what follows it, one byte less is
// incomplete, and a max one byte short is 431.
func checkRequestHeadInvariants(t *testing.T, in []byte) {
	var h requestHead
	n, err := parseRequestHead(in, &h, len(in)+1)
	if err != nil || n == 0 {
		return
	}
	if n2, err := parseRequestHead(in[:n], &h, n); n2 != n || err != nil {
		t.Fatalf("the head alone = %d, %v; want %d, nil", n2, err, n)
	}
	if n2, err := parseRequestHead(in[:n-1], &h, n); n2 != 0 || err != nil {
		t.Fatalf("the head less one byte = %d, %v; want 0, nil", n2, err)
	}
	var we *wireError
	if _, err := parseRequestHead(in, &h, n-1); !errors.As(err, &we) || we.status != 431 {
		t.Fatalf("the head with max %d = %v; want status 431", n-1, err)
	}
}

// netHTTPReadRequest is net/http's readRequest, what its server calls: unlike
// the exported http.ReadRequest it keeps the Host field in req.Header, which
// the server's checks look at. net/http keeps the linkname working on purpose
// (go.dev/issue/67401).
//
//go:linkname netHTTPReadRequest net/http.readRequest
func netHTTPReadRequest(b *bufio.Reader) (*http.Request, error)

// readRequestLikeNetHTTPServer reads a request head as net/http's server does:
// readRequest, then the checks conn.readRequest makes (server.go). It returns
// how many bytes of buf the head took.
func readRequestLikeNetHTTPServer(buf []byte) (*http.Request, int, error) {
	rd := bytes.NewReader(buf)
	br := bufio.NewReader(rd)
	req, err := netHTTPReadRequest(br)
	if err != nil {
		return nil, 0, err
	}
	consumed := len(buf) - rd.Len() - br.Buffered()
	isH2Upgrade := req.Method == "PRI" && len(req.Header) == 0 && req.URL.Path == "*" && req.Proto == "HTTP/2.0"
	if req.ProtoMajor != 1 && !(req.ProtoMajor == 2 && req.ProtoMinor == 0 && req.Method == "PRI" && req.RequestURI == "*") {
		return req, consumed, errors.New("net/http server: unsupported protocol version")
	}
	hosts, haveHost := req.Header["Host"]
	if req.ProtoAtLeast(1, 1) && (!haveHost || len(hosts) == 0) && !isH2Upgrade && req.Method != "CONNECT" {
		return req, consumed, errors.New("net/http server: missing required Host header")
	}
	if len(hosts) == 1 && !validHostHeaderAsHTTPGuts(hosts[0]) {
		return req, consumed, errors.New("net/http server: malformed Host header")
	}
	for name := range req.Header {
		for _, c := range []byte(name) {
			if !strings.ContainsRune(httpgutsTokenBytes, rune(c)) {
				return req, consumed, errors.New("net/http server: invalid header name")
			}
		}
	}
	return req, consumed, nil
}

// httpgutsTokenBytes are the bytes x/net/http/httpguts.ValidHeaderFieldName
// allows (tchar), spelled out here independently of wire.go.
const httpgutsTokenBytes = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// validHostHeaderAsHTTPGuts is x/net/http/httpguts.ValidHostHeader (the
// module does not depend on x/net), with its byte table spelled out.
func validHostHeaderAsHTTPGuts(h string) bool {
	const allowed = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!$%&'()*+,-.:;=[]_~"
	for _, c := range []byte(h) {
		if !strings.ContainsRune(allowed, rune(c)) {
			return false
		}
	}
	return true
}

// leadingEmptyLinesLength is how many bytes of empty lines parseRequestHead
// skips at the start of buf (at most leadingEmptyLineLimit lines).
func leadingEmptyLinesLength(buf []byte) int {
	pos := 0
	for range leadingEmptyLineLimit {
		switch {
		case bytes.HasPrefix(buf[pos:], []byte("\n")):
			pos++
		case bytes.HasPrefix(buf[pos:], []byte("\r\n")):
			pos += 2
		default:
			return pos
		}
	}
	return pos
}

// offsetIn is where sub, a subslice of buf whose capacity is its length,
// starts in buf.
func offsetIn(buf, sub []byte) int { return len(buf) - cap(sub) }

func compareRequestWithNetHTTP(t testing.TB, in []byte) {
	t.Helper()
	buf := slices.Clip(bytes.Clone(in))
	var h requestHead
	n, err := parseRequestHead(buf, &h, len(buf)+1)
	skip := leadingEmptyLinesLength(buf) // difference 1
	ref, consumed, refErr := readRequestLikeNetHTTPServer(buf[skip:])
	accepted := err == nil && n > 0

	switch {
	case accepted && refErr != nil:
		var urlErr *url.Error
		if errors.As(refErr, &urlErr) && !bytes.Equal(h.target, []byte("/")) { // difference 7
			off := offsetIn(buf, h.target)
			compareRequestWithNetHTTP(t, slices.Concat(buf[:off], []byte("/"), buf[off+len(h.target):]))
			return
		}
		t.Fatalf("%q: we accept, net/http rejects: %v", buf, refErr)
	case !accepted && refErr == nil:
		if !deliberateRequestDifference(err, ref, buf) {
			t.Fatalf("%q: we reject (%d, %v), net/http accepts %+v", buf, n, err, ref)
		}
		return
	case !accepted:
		return
	}

	if n != skip+consumed {
		t.Errorf("%q: head length %d, net/http %d", buf, n, skip+consumed)
	}
	if string(h.method) != ref.Method || string(h.target) != ref.RequestURI || ref.ProtoMajor != 1 || h.minor != ref.ProtoMinor {
		t.Errorf("%q: request line %q %q 1.%d, net/http %q %q %s", buf, h.method, h.target, h.minor, ref.Method, ref.RequestURI, ref.Proto)
	}
	compareHeaders(t, buf, h.headers, ref.Header, false)
	wantLength := h.contentLength
	if !h.chunked && wantLength == -1 {
		wantLength = 0 // net/http's "no body" for a request
	}
	if ref.ContentLength != wantLength || h.chunked != slices.Equal(ref.TransferEncoding, []string{"chunked"}) {
		t.Errorf("%q: length %d chunked %v, net/http %d %q", buf, h.contentLength, h.chunked, ref.ContentLength, ref.TransferEncoding)
	}
	if ref.Close != !h.keepAlive {
		t.Errorf("%q: keepAlive %v, net/http Close %v", buf, h.keepAlive, ref.Close)
	}
	hosts, haveHost := ref.Header["Host"]
	if haveHost != (h.host != nil) || haveHost && hosts[0] != string(h.host) {
		t.Errorf("%q: host %q (present %v), net/http %q", buf, h.host, h.host != nil, hosts)
	}
}

// deliberateRequestDifference reports whether our rejection of a request
// net/http accepts is one of the listed differences.
func deliberateRequestDifference(err error, ref *http.Request, buf []byte) bool {
	var we *wireError
	if !errors.As(err, &we) {
		return false
	}
	switch {
	case we.status == 505: // difference 2
		return !(ref.ProtoMajor == 1 && ref.ProtoMinor <= 1)
	case we.reason == "obs-fold or whitespace before a header field": // difference 3
		return hasObsFold(buf)
	case we.reason == "transfer-encoding with content-length": // difference 4
		return slices.Equal(ref.TransferEncoding, []string{"chunked"})
	case we.reason == "transfer-encoding in an http/1.0 request": // difference 5
		return ref.ProtoMinor == 0
	case we.status == 431: // difference 6
		return bytes.Count(buf, []byte("\n")) > headFieldLimit
	case we.reason == "malformed request line: invalid target": // difference 7
		return ref.RequestURI == ""
	case we.reason == "missing host": // difference 8
		return ref.Method == "CONNECT"
	}
	return false
}

// hasObsFold reports whether a line of buf's header section starts with
// whitespace.
func hasObsFold(buf []byte) bool {
	buf = buf[leadingEmptyLinesLength(buf):]
	lf := bytes.IndexByte(buf, '\n')
	if lf < 0 {
		return false
	}
	fields := buf[lf:] // from the request line's LF
	end := len(fields)
	for _, blank := range []string{"\n\r\n", "\n\n"} {
		if i := bytes.Index(fields, []byte(blank)); i >= 0 && i < end {
			end = i
		}
	}
	if end < len(fields) {
		fields = fields[:end+1]
	}
	return bytes.Contains(fields, []byte("\n ")) || bytes.Contains(fields, []byte("\n\t"))
}

// compareHeaders compares our fields with net/http's header map, leaving out
// the framing fields net/http consumes (compared through their meaning) and
// the Cache-Control net/http adds for "Pragma: no-cache".
func compareHeaders(t testing.TB, buf []byte, fields []header, ref http.Header, response bool) {
	t.Helper()
	ours := http.Header{}
	for _, f := range fields {
		name := textproto.CanonicalMIMEHeaderKey(string(f.name))
		ours[name] = append(ours[name], string(f.value))
	}
	theirs := ref.Clone()
	if theirs == nil {
		theirs = http.Header{}
	}
	for _, name := range []string{"Transfer-Encoding", "Content-Length"} {
		delete(ours, name)
		delete(theirs, name)
	}
	if _, ok := ours["Cache-Control"]; !ok && len(ours["Pragma"]) > 0 && ours["Pragma"][0] == "no-cache" {
		delete(theirs, "Cache-Control")
	}
	if _, ok := theirs["Connection"]; response && !ok {
		delete(ours, "Connection") // net/http removes it from a response that says close
	}
	if !reflect.DeepEqual(ours, theirs) {
		t.Errorf("%q: header fields\n%q\nnet/http\n%q", buf, ours, theirs)
	}
}

func compareResponseWithNetHTTP(t testing.TB, in []byte) {
	t.Helper()
	buf := slices.Clip(bytes.Clone(in))
	var h responseHead
	n, err := parseResponseHead(buf, &h, len(buf)+1)
	rd := bytes.NewReader(buf)
	br := bufio.NewReader(rd)
	ref, refErr := http.ReadResponse(br, nil)
	consumed := len(buf) - rd.Len() - br.Buffered()
	accepted := err == nil && n > 0

	switch {
	case accepted && refErr != nil:
		if strings.Contains(refErr.Error(), "transfer encoding") { // difference 10
			renamed := slices.Clone(buf)
			for _, f := range h.headers {
				if lowerEquals(f.name, "transfer-encoding") {
					renamed[offsetIn(buf, f.name)] = 'X'
				}
			}
			if !bytes.Equal(renamed, buf) {
				compareResponseWithNetHTTP(t, renamed)
				return
			}
		}
		t.Fatalf("%q: we accept, net/http rejects: %v", buf, refErr)
	case !accepted && refErr == nil:
		if !deliberateResponseDifference(err, ref) {
			t.Fatalf("%q: we reject (%d, %v), net/http accepts %+v", buf, n, err, ref)
		}
		return
	case !accepted:
		return
	}

	if n != consumed {
		t.Errorf("%q: head length %d, net/http %d", buf, n, consumed)
	}
	code := strings.TrimPrefix(ref.Status, ref.Status[:min(3, len(ref.Status))])
	if ref.ProtoMajor != 1 || h.minor != ref.ProtoMinor || h.status != ref.StatusCode || strings.TrimPrefix(code, " ") != string(h.reason) {
		t.Errorf("%q: status line 1.%d %d %q, net/http %s %q", buf, h.minor, h.status, h.reason, ref.Proto, ref.Status)
	}
	compareHeaders(t, buf, h.headers, ref.Header, true)
	noBody := h.status/100 == 1 || h.status == 204 || h.status == 304
	wantLength := h.contentLength
	if noBody {
		wantLength = 0
	}
	if ref.ContentLength != wantLength || h.chunked != slices.Equal(ref.TransferEncoding, []string{"chunked"}) {
		t.Errorf("%q: length %d chunked %v, net/http %d %q", buf, h.contentLength, h.chunked, ref.ContentLength, ref.TransferEncoding)
	}
	wantClose := !h.keepAlive || !h.chunked && h.contentLength == -1 && !noBody // a close-delimited body
	if ref.Close != wantClose {
		t.Errorf("%q: keepAlive %v, net/http Close %v", buf, h.keepAlive, ref.Close)
	}
}

// deliberateResponseDifference reports whether our rejection of a response
// net/http accepts is one of the listed differences.
func deliberateResponseDifference(err error, ref *http.Response) bool {
	var we *wireError
	if !errors.As(err, &we) {
		return false
	}
	switch we.reason {
	case "unsupported http version " + ref.Proto: // difference 2
		return !(ref.ProtoMajor == 1 && ref.ProtoMinor <= 1)
	case "obs-fold or whitespace before a header field": // difference 3
		return true // net/http rejects whitespace before the first field itself, so this is obs-fold
	case "more than 128 header fields": // difference 6
		return true
	case "status code below 100", "malformed status code": // difference 9
		return ref.StatusCode < 100
	case "transfer-encoding in an http/1.0 response": // difference 10
		return ref.ProtoMinor == 0
	case "whitespace before the colon of a header field": // difference 11
		for name := range ref.Header {
			if strings.ContainsAny(name, " \t") {
				return true
			}
		}
	case "invalid byte in reason phrase": // difference 12
		return true
	}
	return false
}

// chunkedRequestHead is the head net/http reads before the chunked bodies.
const chunkedRequestHead = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"

func compareChunkedWithNetHTTP(t testing.TB, body []byte, splitSeed uint64) {
	t.Helper()
	var s chunkedScanner
	n, done, err := scanAll(&s, body, []int{len(body) + 1})
	r := rand.New(rand.NewPCG(splitSeed, 7))
	sizes := make([]int, 1+r.IntN(8))
	for i := range sizes {
		sizes[i] = 1 + r.IntN(1+len(body)/2)
	}
	for _, split := range [][]int{sizes, {1}} {
		n2, done2, err2 := scanAll(&s, body, split)
		if n2 != n || done2 != done || (err2 == nil) != (err == nil) {
			t.Fatalf("%q: in pieces of %v: %d, %v, %v; in one piece: %d, %v, %v", body, split, n2, done2, err2, n, done, err)
		}
	}

	all := append([]byte(chunkedRequestHead), body...)
	rd := bytes.NewReader(all)
	br := bufio.NewReader(rd)
	req, err2 := http.ReadRequest(br)
	if err2 != nil {
		t.Fatalf("net/http reading %q: %v", chunkedRequestHead, err2)
	}
	_, refErr := io.ReadAll(req.Body)
	consumed := len(all) - rd.Len() - br.Buffered() - len(chunkedRequestHead)

	switch {
	case done && refErr == nil:
		if n != consumed {
			t.Fatalf("%q: body length %d, net/http %d", body, n, consumed)
		}
	case done:
		if !strings.Contains(refErr.Error(), "suspiciously long trailer") { // difference 14
			t.Fatalf("%q: we accept %d bytes, net/http rejects: %v", body, n, refErr)
		}
	case refErr == nil:
		var we *wireError
		if !errors.As(err, &we) {
			t.Fatalf("%q: we need more bytes (%d), net/http accepts %d", body, n, consumed)
		}
		switch we.reason {
		case "bare lf in trailer section", "obs-fold or whitespace before a trailer field",
			"whitespace before the colon of a trailer field": // difference 13
		case "invalid byte in chunk extension": // difference 15
		case "refused trailer field": // difference 16
		default:
			t.Fatalf("%q: we reject (%v), net/http accepts %d bytes", body, err, consumed)
		}
	}
}
