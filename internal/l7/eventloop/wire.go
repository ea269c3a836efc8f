package eventloop

// HTTP/1.1 message framing (RFC 9112) for a proxy that forwards bytes as they
// are: where a head ends, how long the body after it is, and whether the
// connection stays open. Everything here is strict where framing is at stake
// (request smuggling lives in the gaps between two parsers' opinions) and
// lenient only where net/http and nginx are too (a bare LF ends a line).
//
// Choices the RFC leaves open, written down once:
//   - A Content-Length list ("5, 5") is rejected, like net/http; repeated
//     Content-Length fields must carry identical bytes ("5" and "05" differ).
//   - A request's Transfer-Encoding must be exactly one field holding exactly
//     "chunked" (any case); anything else is 501 ("chunked," too), an empty one
//     400, with Content-Length 400, in HTTP/1.0 400.
//   - An HTTP/1.0 response with Transfer-Encoding is 502: RFC 9112 6.1 says its
//     framing is faulty, and a proxy cannot forward faulty framing safely. So
//     is a response whose Transfer-Encoding is not exactly one "chunked".
//   - A request target holding '#' is 400 (RFC 9112 3.2 has no fragment in
//     a request-target; an upstream that cuts it off would serve a path that
//     no route matched).
//   - Chunk lines end in CRLF only (a bare LF there is what RFC errata 7633
//     refused, and what net/http rejects); so do trailer lines, whose fields
//     follow the header rules (no obs-fold, no whitespace before the colon).
//   - Trailer fields are relayed with their values, except the framing,
//     routing, connection and forwarding fields (refusedTrailer): a body
//     whose trailer section has one is malformed, and cut off there.
//   - The Host value is checked with the byte set net/http's server uses
//     (x/net/http/httpguts ValidHostHeader), which excludes whitespace and CTLs.

import (
	"bytes"
	"net/http"
	"strconv"
)

// Limits of the head and chunked-body parsers. Each bounds work or memory per
// connection; the ones shared with net/http have net/http's values so that the
// two accept the same messages.
const (
	headFieldLimit        = 128     // header fields in one head (431 above)
	leadingEmptyLineLimit = 4       // CRLFs skipped before a request line (RFC 9112 2.2)
	chunkLineLimit        = 4096    // a chunk-size line with its extensions and CRLF (net/http's bufio size)
	chunkSizeDigitLimit   = 16      // hex digits of a chunk size, leading zeros included (net/http)
	chunkSizeLimit        = 1 << 62 // largest chunk size
	chunkOverheadLimit    = 16 << 10
	trailerLineLimit      = 8 << 10
	trailerSectionLimit   = 64 << 10
)

// wireError is a malformed or unsupported message; status is the HTTP status
// to answer a client with (400, 431, 501, 505) or, for responses, 502.
type wireError struct {
	status int
	reason string // lowercase, for logs and the 4xx body
}

func (e *wireError) Error() string {
	return "http " + strconv.Itoa(e.status) + ": " + e.reason
}

// header is one header field: name and value are subslices of the parsed buffer
// (value with surrounding optional whitespace trimmed).
type header struct{ name, value []byte }

type requestHead struct {
	method, target []byte   // subslices of buf
	minor          int      // HTTP/1.minor: 0 or 1
	headers        []header // in order; parse reuses headers[:0]
	contentLength  int64    // -1 when there is no Content-Length
	chunked        bool     // Transfer-Encoding: chunked (the final and only coding)
	keepAlive      bool     // 1.1 without "Connection: close"; 1.0 with "Connection: keep-alive"
	expectContinue bool     // Expect: 100-continue
	upgrade        bool     // Connection lists "upgrade" and an Upgrade header is present
	host           []byte   // the Host header's value; nil when absent
	connection     [][]byte // the tokens listed in every Connection header, reused
}

type responseHead struct {
	minor         int
	status        int // 100-999
	reason        []byte
	headers       []header // reused
	contentLength int64    // -1 none
	chunked       bool
	keepAlive     bool // 1.1 without close / 1.0 with keep-alive
	connection    [][]byte
}

// headStatus is what a head parser answers for a malformed head and for one
// too large: a request parser answers the client, a response parser always
// answers 502.
type headStatus struct {
	malformed, tooLarge int
}

// parseRequestHead parses the request head at the start of buf into h.
// n is the head's length including the blank line that ends it; n == 0 and
// err == nil mean buf holds no complete head yet. A head longer than max
// bytes (complete or not) is a 431 error.
func parseRequestHead(buf []byte, h *requestHead, max int) (n int, err error) {
	*h = requestHead{headers: h.headers[:0], connection: h.connection[:0], contentLength: -1}
	statuses := headStatus{malformed: http.StatusBadRequest, tooLarge: http.StatusRequestHeaderFieldsTooLarge}
	b := buf
	if len(b) > max {
		b = b[:max]
	}
	pos, complete, err := skipEmptyLines(b)
	if err != nil {
		return 0, err
	}
	if !complete {
		return finishIncomplete(buf, max, statuses)
	}
	pos, err = h.parseRequestLine(b, pos)
	if pos == 0 && err == nil {
		return finishIncomplete(buf, max, statuses)
	}
	if err != nil {
		return 0, err
	}
	h.headers, n, err = parseFields(b, pos, h.headers, statuses)
	if n == 0 && err == nil {
		return finishIncomplete(buf, max, statuses)
	}
	if err != nil {
		return 0, err
	}
	if err := h.interpretFields(); err != nil {
		return 0, err
	}
	return n, nil
}

// parseResponseHead parses the response head at the start of buf into h, with
// parseRequestHead's contract; every error is status 502.
func parseResponseHead(buf []byte, h *responseHead, max int) (n int, err error) {
	*h = responseHead{headers: h.headers[:0], connection: h.connection[:0], contentLength: -1}
	statuses := headStatus{malformed: http.StatusBadGateway, tooLarge: http.StatusBadGateway}
	b := buf
	if len(b) > max {
		b = b[:max]
	}
	pos, err := h.parseStatusLine(b)
	if pos == 0 && err == nil {
		return finishIncomplete(buf, max, statuses)
	}
	if err != nil {
		return 0, err
	}
	h.headers, n, err = parseFields(b, pos, h.headers, statuses)
	if n == 0 && err == nil {
		return finishIncomplete(buf, max, statuses)
	}
	if err != nil {
		return 0, err
	}
	if err := h.interpretFields(); err != nil {
		return 0, err
	}
	return n, nil
}

// finishIncomplete answers for a head that did not end within the first max
// bytes of buf: too large if buf already holds more than max bytes, else wait.
func finishIncomplete(buf []byte, max int, statuses headStatus) (int, error) {
	if len(buf) > max {
		return 0, &wireError{statuses.tooLarge, "head larger than " + strconv.Itoa(max) + " bytes"}
	}
	return 0, nil
}

// skipEmptyLines returns where the request line starts after at most
// leadingEmptyLineLimit empty lines; complete is false when b ends before
// that is known.
func skipEmptyLines(b []byte) (pos int, complete bool, err error) {
	for skipped := 0; ; skipped++ {
		switch {
		case pos < len(b) && b[pos] == '\n':
			pos++
		case pos+1 < len(b) && b[pos] == '\r' && b[pos+1] == '\n':
			pos += 2
		case pos == len(b) || pos+1 == len(b) && b[pos] == '\r':
			return 0, false, nil
		default:
			return pos, true, nil
		}
		if skipped == leadingEmptyLineLimit {
			return 0, false, &wireError{http.StatusBadRequest, "too many empty lines before the request line"}
		}
	}
}

// parseRequestLine parses `method SP target SP HTTP/1.x` and its line end
// starting at pos; it returns where the header fields start, or 0 and nil when
// b ends first. Errors come as soon as a byte rules the line out.
func (h *requestHead) parseRequestLine(b []byte, pos int) (int, error) {
	i := pos
	for i < len(b) && isTchar(b[i]) {
		i++
	}
	if i == len(b) {
		return 0, nil
	}
	if b[i] != ' ' || i == pos {
		return 0, &wireError{http.StatusBadRequest, "malformed request line: invalid method"}
	}
	h.method = b[pos:i]
	i++
	start := i
	for i < len(b) && b[i] > ' ' && b[i] != 0x7f {
		i++
	}
	if i == len(b) {
		return 0, nil
	}
	if b[i] != ' ' || i == start {
		return 0, &wireError{http.StatusBadRequest, "malformed request line: invalid target"}
	}
	h.target = b[start:i]
	i++
	// The version and its line end: "HTTP/1.1\r\n" is 10 bytes, so no LF in
	// the next 10 rules the line out before it is complete.
	rest := b[i:]
	if len(rest) > len("HTTP/1.1\r\n") {
		rest = rest[:len("HTTP/1.1\r\n")]
	}
	lf := bytes.IndexByte(rest, '\n')
	if lf < 0 {
		if len(rest) == len("HTTP/1.1\r\n") {
			return 0, &wireError{http.StatusBadRequest, "malformed request line: invalid version"}
		}
		return 0, nil
	}
	version := rest[:lf]
	if len(version) > 0 && version[len(version)-1] == '\r' {
		version = version[:len(version)-1]
	}
	minor, err := parseVersion(version, http.StatusBadRequest, http.StatusHTTPVersionNotSupported)
	if err != nil {
		return 0, err
	}
	h.minor = minor
	return i + lf + 1, nil
}

// parseVersion accepts exactly HTTP/1.0 and HTTP/1.1 and returns the minor
// version; another HTTP/d.d is status unsupported, anything else malformed.
func parseVersion(v []byte, malformed, unsupported int) (int, error) {
	if len(v) == len("HTTP/1.1") && string(v[:len("HTTP/")]) == "HTTP/" && v[6] == '.' &&
		isDigit(v[5]) && isDigit(v[7]) {
		if v[5] == '1' && (v[7] == '0' || v[7] == '1') {
			return int(v[7] - '0'), nil
		}
		return 0, &wireError{unsupported, "unsupported http version " + string(v)}
	}
	return 0, &wireError{malformed, "malformed http version"}
}

// parseStatusLine parses `HTTP/1.x SP 3DIGIT [SP reason]` and its line end;
// it returns where the header fields start, or 0 and nil when b ends first.
// Like net/http it allows several spaces before the status code.
func (h *responseHead) parseStatusLine(b []byte) (int, error) {
	lf := bytes.IndexByte(b, '\n')
	if lf < 0 {
		return 0, nil
	}
	line := b[:lf]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if len(line) < len("HTTP/1.1 ") || line[len("HTTP/1.1")] != ' ' {
		return 0, &wireError{http.StatusBadGateway, "malformed status line"}
	}
	minor, err := parseVersion(line[:len("HTTP/1.1")], http.StatusBadGateway, http.StatusBadGateway)
	if err != nil {
		return 0, err
	}
	h.minor = minor
	i := len("HTTP/1.1 ")
	for i < len(line) && line[i] == ' ' {
		i++
	}
	code := line[i:]
	if len(code) < 3 || !isDigit(code[0]) || !isDigit(code[1]) || !isDigit(code[2]) || len(code) > 3 && code[3] != ' ' {
		return 0, &wireError{http.StatusBadGateway, "malformed status code"}
	}
	h.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if h.status < 100 {
		return 0, &wireError{http.StatusBadGateway, "status code below 100"}
	}
	h.reason = code[3:3]
	if len(code) > 3 {
		h.reason = code[4:]
	}
	for _, c := range h.reason {
		if !isFieldValueByte(c) {
			return 0, &wireError{http.StatusBadGateway, "invalid byte in reason phrase"}
		}
	}
	return lf + 1, nil
}

// parseFields appends the header fields starting at pos to headers up to the
// blank line that ends the head, and returns the head's length; 0 and nil
// when b ends first. Every complete line is checked as soon as it is seen.
func parseFields(b []byte, pos int, headers []header, statuses headStatus) ([]header, int, error) {
	for {
		if pos >= len(b) {
			return headers, 0, nil
		}
		switch b[pos] {
		case '\n':
			return headers, pos + 1, nil
		case '\r':
			if pos+1 == len(b) {
				return headers, 0, nil
			}
			if b[pos+1] != '\n' {
				return headers, 0, &wireError{statuses.malformed, "bare cr in header section"}
			}
			return headers, pos + 2, nil
		case ' ', '\t':
			// obs-fold (RFC 9112 5.2): a proxy may reject it, and does, since
			// unfolding would change the bytes it forwards.
			return headers, 0, &wireError{statuses.malformed, "obs-fold or whitespace before a header field"}
		}
		i := pos
		for i < len(b) && isTchar(b[i]) {
			i++
		}
		if i == len(b) {
			return headers, 0, nil
		}
		if b[i] != ':' || i == pos {
			if b[i] == ' ' || b[i] == '\t' {
				return headers, 0, &wireError{statuses.malformed, "whitespace before the colon of a header field"}
			}
			return headers, 0, &wireError{statuses.malformed, "invalid header field name"}
		}
		name := b[pos:i]
		i++
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		start := i
		for i < len(b) && isFieldValueByte(b[i]) {
			i++
		}
		if i == len(b) {
			return headers, 0, nil
		}
		end := i
		switch b[i] {
		case '\n':
			pos = i + 1
		case '\r':
			if i+1 == len(b) {
				return headers, 0, nil
			}
			if b[i+1] != '\n' {
				return headers, 0, &wireError{statuses.malformed, "bare cr in header field value"}
			}
			pos = i + 2
		default:
			return headers, 0, &wireError{statuses.malformed, "invalid byte in header field value"}
		}
		for end > start && (b[end-1] == ' ' || b[end-1] == '\t') {
			end--
		}
		if len(headers) == headFieldLimit {
			return headers, 0, &wireError{statuses.tooLarge, "more than " + strconv.Itoa(headFieldLimit) + " header fields"}
		}
		headers = append(headers, header{name: name, value: b[start:end]})
	}
}

// framingFields is what the header fields shared by requests and responses
// say about framing and the connection.
type framingFields struct {
	contentLength    int64
	contentLengthRaw []byte // the first Content-Length value, to compare repeats with
	hasLength        bool
	transferEncoding int    // Transfer-Encoding fields seen
	firstCodings     []byte // the first Transfer-Encoding value
	codings          int    // transfer codings listed over all fields
	close, keepAlive bool   // Connection tokens
	upgradeToken     bool
}

// collect reads one header field into f when it is one of the framing fields,
// appending Connection tokens to connection; it reports whether it was one.
func (f *framingFields) collect(field header, connection [][]byte, malformed int) (bool, [][]byte, error) {
	switch {
	case len(field.name) == len("content-length") && lowerEquals(field.name, "content-length"):
		if !f.hasLength {
			n, ok := parseContentLengthValue(field.value)
			if !ok {
				return true, connection, &wireError{malformed, "invalid content-length"}
			}
			f.contentLength, f.contentLengthRaw, f.hasLength = n, field.value, true
		} else if !bytes.Equal(field.value, f.contentLengthRaw) {
			return true, connection, &wireError{malformed, "content-length fields with different values"}
		}
	case len(field.name) == len("transfer-encoding") && lowerEquals(field.name, "transfer-encoding"):
		f.transferEncoding++
		if f.transferEncoding == 1 {
			f.firstCodings = field.value
		}
		for rest := field.value; len(rest) > 0; {
			var coding []byte
			coding, rest = nextListElement(rest)
			if len(coding) > 0 {
				f.codings++
			}
		}
	case len(field.name) == len("connection") && lowerEquals(field.name, "connection"):
		for rest := field.value; len(rest) > 0; {
			var token []byte
			token, rest = nextListElement(rest)
			if len(token) == 0 {
				continue
			}
			connection = append(connection, token)
			switch {
			case lowerEquals(token, "close"):
				f.close = true
			case lowerEquals(token, "keep-alive"):
				f.keepAlive = true
			case lowerEquals(token, "upgrade"):
				f.upgradeToken = true
			}
		}
	default:
		return false, connection, nil
	}
	return true, connection, nil
}

// keepAlive is RFC 9112 9.3: HTTP/1.1 persists unless closed, HTTP/1.0 only
// when asked to.
func (f *framingFields) keepAliveFor(minor int) bool {
	if f.close {
		return false
	}
	return minor == 1 || f.keepAlive
}

func (h *requestHead) interpretFields() error {
	var (
		f          framingFields
		hosts      int
		hasUpgrade bool
		err        error
		known      bool
	)
	for _, field := range h.headers {
		known, h.connection, err = f.collect(field, h.connection, http.StatusBadRequest)
		if err != nil {
			return err
		}
		if known {
			continue
		}
		switch {
		case len(field.name) == len("host") && lowerEquals(field.name, "host"):
			hosts++
			if hosts > 1 {
				return &wireError{http.StatusBadRequest, "more than one host field"}
			}
			for _, c := range field.value {
				if !isHostByte(c) {
					return &wireError{http.StatusBadRequest, "invalid host"}
				}
			}
			h.host = field.value
		case len(field.name) == len("expect") && lowerEquals(field.name, "expect"):
			for rest := field.value; len(rest) > 0; {
				var expectation []byte
				expectation, rest = nextListElement(rest)
				if lowerEquals(expectation, "100-continue") {
					h.expectContinue = true
				}
			}
		case len(field.name) == len("upgrade") && lowerEquals(field.name, "upgrade"):
			hasUpgrade = hasUpgrade || len(field.value) > 0
		}
	}
	if h.minor == 1 && hosts == 0 {
		return &wireError{http.StatusBadRequest, "missing host"}
	}
	if f.transferEncoding > 0 {
		// RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty
		// framing, and one with Content-Length too is a smuggling attempt
		// until proven otherwise.
		switch {
		case h.minor == 0:
			return &wireError{http.StatusBadRequest, "transfer-encoding in an http/1.0 request"}
		case f.hasLength:
			return &wireError{http.StatusBadRequest, "transfer-encoding with content-length"}
		case f.codings == 0:
			return &wireError{http.StatusBadRequest, "empty transfer-encoding"}
		case f.transferEncoding != 1 || !lowerEquals(f.firstCodings, "chunked"):
			// Not even "chunked," with its empty list element: a server that
			// compares the whole value would frame the body differently.
			return &wireError{http.StatusNotImplemented, "unsupported transfer-encoding"}
		}
		h.chunked = true
	}
	if f.hasLength {
		h.contentLength = f.contentLength
	}
	h.keepAlive = f.keepAliveFor(h.minor)
	h.upgrade = f.upgradeToken && hasUpgrade
	return nil
}

func (h *responseHead) interpretFields() error {
	var f framingFields
	for _, field := range h.headers {
		var err error
		if _, h.connection, err = f.collect(field, h.connection, http.StatusBadGateway); err != nil {
			return err
		}
	}
	h.keepAlive = f.keepAliveFor(h.minor)
	if f.transferEncoding > 0 {
		// RFC 9112 6.3: chunked as the final coding frames the body and
		// overrides Content-Length (which is then not relayed). Another
		// coding would leave the body to end when the connection closes:
		// like net/http's Transport, the relay takes exactly one
		// Transfer-Encoding field holding exactly "chunked" (any case), and
		// answers anything else 502 rather than guess.
		switch {
		case h.minor == 0:
			return &wireError{http.StatusBadGateway, "transfer-encoding in an http/1.0 response"}
		case f.codings == 0:
			return &wireError{http.StatusBadGateway, "empty transfer-encoding"}
		case f.transferEncoding != 1 || !lowerEquals(f.firstCodings, "chunked"):
			return &wireError{http.StatusBadGateway, "unsupported transfer-encoding"}
		}
		h.chunked = true
		return nil
	}
	if f.hasLength {
		h.contentLength = f.contentLength
	}
	return nil
}

// parseContentLengthValue parses 1*DIGIT into an int64.
func parseContentLengthValue(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, false
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// nextListElement splits the first element off a comma-separated list
// (RFC 9110 5.6.1) and trims its optional whitespace.
func nextListElement(list []byte) (element, rest []byte) {
	element = list
	if comma := bytes.IndexByte(list, ','); comma >= 0 {
		element, rest = list[:comma], list[comma+1:]
	}
	for len(element) > 0 && (element[0] == ' ' || element[0] == '\t') {
		element = element[1:]
	}
	for len(element) > 0 && (element[len(element)-1] == ' ' || element[len(element)-1] == '\t') {
		element = element[:len(element)-1]
	}
	return element, rest
}

// lowerEquals reports whether b equals the lowercase ASCII string lower,
// ignoring the case of b's letters.
func lowerEquals(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// isTchar reports whether c may appear in a token (RFC 9110 5.6.2).
func isTchar(c byte) bool {
	const mask = 0 |
		(1<<10-1)<<'0' |
		(1<<26-1)<<'a' |
		(1<<26-1)<<'A' |
		1<<'!' | 1<<'#' | 1<<'$' | 1<<'%' | 1<<'&' | 1<<'\'' | 1<<'*' |
		1<<'+' | 1<<'-' | 1<<'.' | 1<<'^' | 1<<'_' | 1<<'`' | 1<<'|' | 1<<'~'
	return inMask128(c, mask&(1<<64-1), mask>>64)
}

// isHostByte reports whether c may appear in a Host value: the bytes of
// uri-host and port (RFC 3986 reg-name, IP-literal, IPv4address), as net/http's
// server checks them.
func isHostByte(c byte) bool {
	const mask = 0 |
		(1<<10-1)<<'0' |
		(1<<26-1)<<'a' |
		(1<<26-1)<<'A' |
		1<<'!' | 1<<'$' | 1<<'%' | 1<<'&' | 1<<'\'' | 1<<'(' | 1<<')' | 1<<'*' | 1<<'+' |
		1<<',' | 1<<'-' | 1<<'.' | 1<<':' | 1<<';' | 1<<'=' | 1<<'[' | 1<<']' | 1<<'_' | 1<<'~'
	return inMask128(c, mask&(1<<64-1), mask>>64)
}

// inMask128 reports whether c < 128 has its bit set in the 128-bit mask lo|hi<<64.
func inMask128(c byte, lo, hi uint64) bool {
	if c >= 128 {
		return false
	}
	if c < 64 {
		return lo&(1<<c) != 0
	}
	return hi&(1<<(c-64)) != 0
}

// isFieldValueByte reports whether c may appear in a field value or a reason
// phrase: VCHAR, obs-text, SP and HTAB, that is no CTL but HTAB.
func isFieldValueByte(c byte) bool {
	return c >= ' ' && c != 0x7f || c == '\t'
}

// chunkedState is where a chunkedScanner is in the chunked body grammar
// (RFC 9112 7.1).
type chunkedState uint8

const (
	chunkSize         chunkedState = iota // hex digits of chunk-size
	chunkSizeSpace                        // whitespace after the size, before CR
	chunkExtension                        // after ';' up to CR
	chunkSizeLF                           // the LF ending a chunk-size line
	chunkData                             // chunk-data
	chunkDataCR                           // the CR after chunk-data
	chunkDataLF                           // the LF after chunk-data
	chunkTrailerStart                     // the start of a trailer line, or of the final CRLF
	chunkTrailerName                      // a trailer field name
	chunkTrailerValue                     // a trailer field value up to CR
	chunkTrailerLF                        // the LF ending a trailer line
	chunkFinalLF                          // the LF of the final CRLF
	chunkDone
)

// chunkedScanner follows the framing of a chunked body (chunk sizes,
// extensions, data, the last chunk, trailer fields, the final CRLF) without
// changing it: the proxy forwards the bytes as they are.
type chunkedScanner struct {
	state    chunkedState
	size     uint64 // the chunk size being read, then the chunk-data bytes left
	digits   int    // hex digits of the chunk size so far
	line     int    // bytes of the current chunk-size or trailer line, CRLF excluded
	trailer  int    // bytes of the trailer section so far
	overhead int64  // non-data bytes beyond an allowance, counted as net/http counts them (never negative)
	err      error  // sticky
	// name holds the start of the trailer field name being read (names
	// longer than it are none of the refused ones).
	name    [len("x-forwarded-proto")]byte
	nameLen int
}

// refusedTrailer reports whether a trailer field may not be relayed: one
// that frames the message, routes it, names the connection's options or
// says who sent it (RFC 9110 6.5.1 forbids the first three in trailers; a
// recipient that merges trailers into the header fields would take them
// as sent by the proxy). A chunked body with one is cut off there.
func refusedTrailer(name []byte) bool {
	for _, f := range [...]string{"content-length", "transfer-encoding", "trailer", "host", "connection",
		"keep-alive", "te", "upgrade", "proxy-connection", "proxy-authorization", "x-forwarded-for",
		"x-forwarded-host", "x-forwarded-proto", "forwarded"} {
		if lowerEquals(name, f) {
			return true
		}
	}
	return false
}

func (s *chunkedScanner) reset() { *s = chunkedScanner{} }

// scan consumes bytes of the body from p: n is how many of them belong to the
// body (n < len(p) only when done), done reports that the body ended with
// the last byte counted in n. It may be called with any split of the input,
// down to one byte at a time. Errors are *wireError status 400 and stick.
func (s *chunkedScanner) scan(p []byte) (n int, done bool, err error) {
	if s.err != nil {
		return 0, false, s.err
	}
	if s.state == chunkDone {
		return 0, true, nil
	}
	for i := 0; i < len(p); i++ {
		if s.state == chunkData {
			k := uint64(len(p) - i)
			if k > s.size {
				k = s.size
			}
			s.size -= k
			i += int(k) - 1
			if s.size == 0 {
				s.state = chunkDataCR
			}
			continue
		}
		if reason := s.step(p[i]); reason != "" {
			s.err = &wireError{http.StatusBadRequest, reason}
			return i, false, s.err
		}
		if s.state == chunkDone {
			return i + 1, true, nil
		}
	}
	return len(p), false, nil
}

// step advances the scanner over one byte outside chunk-data and returns why
// the byte is wrong, or "".
func (s *chunkedScanner) step(c byte) string {
	switch s.state {
	case chunkSize:
		if d, ok := hexDigit(c); ok {
			s.digits++
			if s.digits > chunkSizeDigitLimit || s.size > chunkSizeLimit>>4 {
				return "chunk size too large"
			}
			s.size = s.size<<4 | uint64(d)
			if s.size > chunkSizeLimit {
				return "chunk size too large"
			}
			return s.countLine()
		}
		if s.digits == 0 {
			return "invalid chunk size"
		}
		switch c {
		case ';':
			s.state = chunkExtension
		case ' ', '\t':
			s.state = chunkSizeSpace
		case '\r':
			s.state = chunkSizeLF
			return ""
		case '\n':
			return "bare lf in chunk line"
		default:
			return "invalid chunk size"
		}
		return s.countLine()
	case chunkSizeSpace:
		switch c {
		case ' ', '\t':
			return s.countLine()
		case '\r':
			s.state = chunkSizeLF
			return ""
		}
		return "invalid chunk size"
	case chunkExtension:
		switch {
		case c == '\r':
			s.state = chunkSizeLF
			return ""
		case c == '\n':
			return "bare lf in chunk line"
		case !isFieldValueByte(c):
			return "invalid byte in chunk extension"
		}
		return s.countLine()
	case chunkSizeLF:
		if c != '\n' {
			return "bare cr in chunk line"
		}
		// net/http's defence against extension floods: allow 16 bytes of
		// line per chunk plus twice the chunk's data.
		// (The allowance is unsigned: twice a size near 2^62 overflows int64.)
		s.overhead += int64(s.line) + 2
		if allowance := 16 + 2*s.size; uint64(s.overhead) <= allowance {
			s.overhead = 0
		} else {
			s.overhead -= int64(allowance)
		}
		if s.overhead > chunkOverheadLimit {
			return "chunked body with too much non-data"
		}
		s.line, s.digits = 0, 0
		if s.size == 0 {
			s.state = chunkTrailerStart
		} else {
			s.state = chunkData
		}
	case chunkDataCR:
		if c != '\r' {
			return "missing crlf after chunk data"
		}
		s.state = chunkDataLF
	case chunkDataLF:
		if c != '\n' {
			return "missing crlf after chunk data"
		}
		s.state = chunkSize
	case chunkTrailerStart:
		switch {
		case c == '\r':
			s.state = chunkFinalLF
			return ""
		case c == '\n':
			return "bare lf in trailer section"
		case c == ' ' || c == '\t':
			return "obs-fold or whitespace before a trailer field"
		case !isTchar(c):
			return "invalid trailer field name"
		}
		s.state = chunkTrailerName
		s.name[0], s.nameLen = c, 1
		return s.countTrailerLine()
	case chunkTrailerName:
		switch {
		case c == ':':
			if s.nameLen <= len(s.name) && refusedTrailer(s.name[:s.nameLen]) {
				return "refused trailer field"
			}
			s.state = chunkTrailerValue
		case c == ' ' || c == '\t':
			return "whitespace before the colon of a trailer field"
		case !isTchar(c):
			return "invalid trailer field name"
		}
		if s.nameLen < len(s.name) {
			s.name[s.nameLen] = c
		}
		s.nameLen++
		return s.countTrailerLine()
	case chunkTrailerValue:
		switch {
		case c == '\r':
			s.state = chunkTrailerLF
			return ""
		case c == '\n':
			return "bare lf in trailer section"
		case !isFieldValueByte(c):
			return "invalid byte in trailer field value"
		}
		return s.countTrailerLine()
	case chunkTrailerLF:
		if c != '\n' {
			return "bare cr in trailer section"
		}
		s.trailer += s.line + 2
		if s.trailer > trailerSectionLimit {
			return "trailer section too large"
		}
		s.line = 0
		s.state = chunkTrailerStart
	case chunkFinalLF:
		if c != '\n' {
			return "bare cr in trailer section"
		}
		s.state = chunkDone
	}
	return ""
}

// countLine counts one more byte of a chunk-size line against its limit.
func (s *chunkedScanner) countLine() string {
	s.line++
	if s.line > chunkLineLimit-2 {
		return "chunk line too long"
	}
	return ""
}

// countTrailerLine counts one more byte of a trailer line against its limit.
func (s *chunkedScanner) countTrailerLine() string {
	s.line++
	if s.line > trailerLineLimit {
		return "trailer line too long"
	}
	return ""
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
