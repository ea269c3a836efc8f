package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The smuggling corpus: raw request and response vectors sent through both
// engines to a raw upstream that records every byte it gets. For each
// vector, every upstream connection must carry exactly one unambiguous
// message (strictMessage) or an unfinished one (nothing the upstream could
// act on), never more; the client must get exactly one unambiguous
// response per request; and both engines must agree on accepting (the
// upstream got a complete message) or refusing. The vectors are written
// from RFC 9112 (6.3 message body length, 7 chunked coding, 11.2 request
// smuggling) and the public request-smuggling research (CL.TE, TE.CL and
// TE.TE obfuscations, Connection naming framing fields, chunk-size and
// line-ending tricks, response splitting). The "accept" ones are valid
// though unusual: an engine that refused everything unusual fails them.

// want is what a vector must come to under both engines.
type want uint8

const (
	accept want = iota + 1 // the upstream gets a complete message (each request of a pipeline its own)
	refuse                 // the upstream gets no complete message; the client an error status or the end
	either                 // both engines the same, whichever
)

func (w want) String() string {
	return [...]string{"", "accept", "refuse", "either"}[w]
}

type requestVector struct {
	name string
	raw  string
	want want
	// messages is how many complete messages the upstream may get (a
	// pipeline); 0 means 1.
	messages int
	// body, when set, is what the upstream must get as the (decoded) body
	// of the first message.
	body *string
}

func strp(s string) *string { return &s }

// corpusDifferences are the vectors on which the engines may disagree on
// accepting, each with its reason. net/http's server decides these before
// any handler runs, so the proxy's net/http path cannot see them; in each
// the net-http engine forwards one message it re-framed itself (no
// ambiguity reaches the upstream), while the event loop, which forwards
// the client's bytes, refuses.
var corpusDifferences = map[string]string{
	"cl.te: content-length then chunked":   "net/http drops the Content-Length and re-frames chunked (RFC 9112 6.3 allows either); the event loop refuses: 400, closed",
	"te.cl: chunked then content-length":   "as cl.te",
	"cl.te: chunked with content-length 0": "as cl.te",
	"obs-fold in a field value":            "net/http unfolds the field; the event loop refuses obs-fold (RFC 9112 5.2) rather than change the bytes it forwards",
	"obs-fold with a tab":                  "as obs-fold",
	"transfer-encoding obs-folded":         "as obs-fold",
	"content-length obs-folded":            "as obs-fold",
	"transfer-encoding in http/1.0":        "net/http deletes Transfer-Encoding from an HTTP/1.0 request and forwards it without a body (the chunks then read as a bad next request); the event loop refuses: 400 (RFC 9112 6.1 faulty framing)",
	"chunk extension with a nul":           "net/http skips chunk extensions unread; the event loop refuses CTLs in them, since it forwards them",
	"trailer obs-fold":                     "net/http reads trailers with textproto (obs-fold, whitespace before the colon); the event loop, which forwards trailer bytes, cuts the body off",
	"trailer space before colon":           "as trailer obs-fold",
	"leading empty line":                   "the event loop skips up to 4 empty lines before the request line (RFC 9112 2.2); net/http's server answers 400",
	"trailer: content-length":              "net/http reads the trailer and drops its value (ReverseProxy sends request trailers without values); the event loop cuts the body off before a framing trailer reaches the upstream",
	"trailer: host":                        "as trailer: content-length",
	"trailer: x-forwarded-for":             "as trailer: content-length",
	"trailer: transfer-encoding":           "as trailer: content-length",
}

func requestVectors() []requestVector {
	const host = "Host: a\r\n"
	var vs []requestVector
	add := func(name string, w want, raw string) { vs = append(vs, requestVector{name: name, raw: raw, want: w}) }
	addBody := func(name, raw, body string) {
		vs = append(vs, requestVector{name: name, raw: raw, want: accept, body: strp(body)})
	}
	post := func(fields, body string) string { return "POST /p HTTP/1.1\r\n" + host + fields + "\r\n" + body }

	// Valid, plain and unusual.
	for _, m := range []string{"GET", "HEAD", "DELETE", "OPTIONS", "PURGE", "M-SEARCH", "X!#$%&'*+-.^_`|~1"} {
		add("method "+m, accept, m+" /m HTTP/1.1\r\n"+host+"\r\n")
	}
	for _, target := range []string{"/", "/a/b/c", "/a?b=c&d", "/a?", "/%41%2F%7e", "/a;p=1", "/~user/", "/a/./b/../c",
		"/" + strings.Repeat("x", 8000), "/a?q=" + strings.Repeat("%20", 1000), "/a:b@c", "/!$&'()*+,;="} {
		add("target "+trunc(target), accept, "GET "+target+" HTTP/1.1\r\n"+host+"\r\n")
	}
	for _, f := range []string{"Host:a", "Host:   a   ", "Host:\ta\t", "Host: a:8080", "Host: [::1]:80", "Host: 198.51.100.7",
		"Host: xn--bcher-kva.example", "Host: a.b-c_d.example"} {
		add("host field "+f, accept, "GET /h HTTP/1.1\r\n"+f+"\r\n\r\n")
	}
	for _, f := range []string{"X-E:", "X-E: ", "X-Sp: a  b   c", "X-Tab: a\tb", "X-Obs: caf\xe9 \xff", "X-Q: \"quoted, string\"",
		"X-Long: " + strings.Repeat("v", 8000), "X-Colon: a:b:c", "x-lower: yes", "X-Under_Score: 1", "X-Many: 1, 2, 3"} {
		add("field "+trunc(f), accept, "GET /f HTTP/1.1\r\n"+host+f+"\r\n\r\n")
	}
	add("100 fields", accept, "GET /f HTTP/1.1\r\n"+host+manyFields(100, 10)+"\r\n")
	add("head of 60 KiB", accept, "GET /f HTTP/1.1\r\n"+host+manyFields(60, 1000)+"\r\n")
	add("repeated field", accept, "GET /f HTTP/1.1\r\n"+host+"X-R: 1\r\nX-R: 2\r\nX-R: 3\r\n\r\n")
	add("bare lf line ends", accept, "GET /lf HTTP/1.1\n"+"Host: a\nX-A: 1\n\n")
	add("http/1.0 without host", accept, "GET /old HTTP/1.0\r\n\r\n")
	add("http/1.0 with host", accept, "GET /old HTTP/1.0\r\n"+host+"\r\n")
	add("http/1.0 keep-alive", accept, "GET /old HTTP/1.0\r\n"+host+"Connection: keep-alive\r\n\r\n")
	add("http/1.0 post", accept, "POST /old HTTP/1.0\r\n"+host+"Content-Length: 3\r\n\r\nabc")
	add("absolute-form", accept, "GET http://a/abs?q=1 HTTP/1.1\r\n"+host+"\r\n")
	add("absolute-form other host", accept, "GET http://other.example:8080/abs HTTP/1.1\r\n"+host+"\r\n")
	add("absolute-form ipv6", accept, "GET http://[2001:db8::1]/abs HTTP/1.1\r\n"+host+"\r\n")
	add("absolute-form https", accept, "GET https://a/abs HTTP/1.1\r\n"+host+"\r\n")
	add("absolute-form uppercase scheme", accept, "GET HTTP://a/abs HTTP/1.1\r\n"+host+"\r\n")
	add("upgrade without 101", accept, "GET /ws HTTP/1.1\r\n"+host+"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	add("upgrade h2c without 101", accept, "GET /h2c HTTP/1.1\r\n"+host+"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
	add("te trailers", accept, "GET /te HTTP/1.1\r\n"+host+"Te: trailers\r\n\r\n")
	add("hop-by-hop named", accept, "GET /hop HTTP/1.1\r\n"+host+"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\r\n")
	add("forwarding fields from the client", accept, "GET /fwd HTTP/1.1\r\n"+host+"X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Host: evil\r\nForwarded: for=1.2.3.4\r\n\r\n")

	// Bodies framed by Content-Length.
	for _, n := range []int{0, 1, 5, 100, 4096, 70000} {
		b := string(bytes.Repeat([]byte{'b'}, n))
		addBody(fmt.Sprintf("content-length %d", n), post("Content-Length: "+strconv.Itoa(n)+"\r\n", b), b)
	}
	addBody("content-length with ows", post("Content-Length:   5  \r\n", "hello"), "hello")
	addBody("content-length with leading zeros", post("Content-Length: 005\r\n", "hello"), "hello")
	addBody("content-length repeated, same value", post("Content-Length: 5\r\nContent-Length: 5\r\n", "hello"), "hello")
	addBody("lowercase content-length", post("content-length: 5\r\n", "hello"), "hello")
	addBody("put with a body", "PUT /p HTTP/1.1\r\n"+host+"Content-Length: 3\r\n\r\nabc", "abc")
	addBody("get with a body", "GET /p HTTP/1.1\r\n"+host+"Content-Length: 3\r\n\r\nabc", "abc")
	addBody("expect 100-continue, body sent at once", post("Expect: 100-continue\r\nContent-Length: 5\r\n", "hello"), "hello")
	addBody("expect 100-continue, chunked", post("Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"), "hello")
	addBody("body that looks like a request", post("Content-Length: 36\r\n", "GET /limited/S HTTP/1.1\r\nHost: a\r\n\r\n"),
		"GET /limited/S HTTP/1.1\r\nHost: a\r\n\r\n")

	// Chunked bodies.
	chunked := func(name, body, decoded string) { addBody(name, post("Transfer-Encoding: chunked\r\n", body), decoded) }
	chunked("chunked", "5\r\nhello\r\n0\r\n\r\n", "hello")
	chunked("chunked empty", "0\r\n\r\n", "")
	chunked("chunked many", "1\r\na\r\n1\r\nb\r\n1\r\nc\r\n0\r\n\r\n", "abc")
	chunked("chunked uppercase hex", "A\r\n0123456789\r\n0\r\n\r\n", "0123456789")
	chunked("chunked leading zeros", "000005\r\nhello\r\n0000\r\n\r\n", "hello")
	chunked("chunk extension", "5;name=value\r\nhello\r\n0\r\n\r\n", "hello")
	chunked("chunk extension quoted", "5;n=\"a b;c\"\r\nhello\r\n0;x\r\n\r\n", "hello")
	chunked("chunk extensions, several", "5;a;b=1;c=\"2\"\r\nhello\r\n0\r\n\r\n", "hello")
	// RFC 9112 7.1.1 allows BWS before a chunk extension's ';', but
	// net/http's chunked reader refuses it, and the event loop too.
	add("chunk extension with bws", either, post("Transfer-Encoding: chunked\r\n", "5 ;a=1\r\nhello\r\n0\r\n\r\n"))
	chunked("chunked trailer", "5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n", "hello")
	chunked("chunked two trailers", "5\r\nhello\r\n0\r\nX-Sum: 42\r\nX-Other: a b\r\n\r\n", "hello")
	chunked("chunked large", "10000\r\n"+strings.Repeat("z", 0x10000)+"\r\n0\r\n\r\n", strings.Repeat("z", 0x10000))
	addBody("mixed-case chunked", post("Transfer-Encoding: ChUnKeD\r\n", "5\r\nhello\r\n0\r\n\r\n"), "hello")
	addBody("chunked with ows", post("Transfer-Encoding:   chunked \r\n", "5\r\nhello\r\n0\r\n\r\n"), "hello")
	addBody("chunked with tab", post("Transfer-Encoding:\tchunked\r\n", "5\r\nhello\r\n0\r\n\r\n"), "hello")
	addBody("chunked with trailer announced", post("Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n", "5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n"), "hello")

	// Pipelines: each request its own message.
	pipe := func(name string, n int, raw string) {
		vs = append(vs, requestVector{name: name, raw: raw, want: accept, messages: n})
	}
	get := "GET /g HTTP/1.1\r\n" + host + "\r\n"
	pipe("two gets", 2, get+get)
	pipe("three gets", 3, get+get+get)
	pipe("post then get", 2, post("Content-Length: 5\r\n", "hello")+get)
	pipe("chunked post then get", 2, post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")+get)
	pipe("chunked post with trailer then get", 2, post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n")+get)
	pipe("content-length 0 then get", 2, post("Content-Length: 0\r\n", "")+get)
	pipe("head then get", 2, "HEAD /h HTTP/1.1\r\n"+host+"\r\n"+get)

	// Connection naming each framing and forwarding field: the field the
	// relay needs stays, the message stays one.
	for _, named := range []string{"Content-Length", "content-length", "Transfer-Encoding", "Host", "X-Forwarded-For",
		"X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded", "Te", "Trailer", "Upgrade", "Expect", "Authorization"} {
		vs = append(vs,
			requestVector{name: "connection names " + named + " (content-length body)", want: accept, body: strp("GET /s HTTP/1.1\r\nHost: a\r\n\r\n"),
				raw: post("Connection: "+named+"\r\nContent-Length: 28\r\n", "GET /s HTTP/1.1\r\nHost: a\r\n\r\n")},
			requestVector{name: "connection names " + named + " (chunked body)", want: accept, body: strp("hello"),
				raw: post("Connection: close, "+named+"\r\nTransfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")})
	}

	// Framing that could be read two ways (CL.TE, TE.CL, TE.TE).
	add("cl.te: content-length then chunked", either, post("Content-Length: 6\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\nG"))
	add("te.cl: chunked then content-length", either, post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", "8\r\nSMUGGLED\r\n0\r\n\r\n"))
	add("cl.te: chunked with content-length 0", either, post("Content-Length: 0\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"))
	for _, te := range []string{"xchunked", "chunked, identity", "identity", "chunked,", ", chunked", "chunked;q=1", "\"chunked\"",
		"gzip, chunked", "chunked, chunked", "chunk", "chunked\x0b", "cHuNkEd, gzip", "identity, chunked", "x"} {
		add("transfer-encoding "+strconv.Quote(te), refuse, post("Transfer-Encoding: "+te+"\r\n", "5\r\nhello\r\n0\r\n\r\n"))
		add("transfer-encoding "+strconv.Quote(te)+" with content-length", refuse,
			post("Content-Length: 5\r\nTransfer-Encoding: "+te+"\r\n", "hello"))
	}
	add("transfer-encoding twice", refuse, post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"))
	add("transfer-encoding twice, second bogus", refuse, post("Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n", "0\r\n\r\n"))
	add("transfer-encoding empty", refuse, post("Transfer-Encoding:\r\n", "0\r\n\r\n"))
	add("transfer-encoding space before colon", refuse, post("Transfer-Encoding : chunked\r\n", "0\r\n\r\n"))
	add("transfer-encoding tab before colon", refuse, post("Transfer-Encoding\t: chunked\r\n", "0\r\n\r\n"))
	add("transfer-encoding obs-folded", either, post("Transfer-Encoding:\r\n chunked\r\n", "0\r\n\r\n"))
	add("transfer-encoding in http/1.0", either, "POST /p HTTP/1.0\r\n"+host+"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	add("transfer-encoding with a nul", refuse, post("Transfer-Encoding: chunked\x00\r\n", "0\r\n\r\n"))
	add("transfer-encoding with a bare cr", refuse, post("Transfer-Encoding: chunked\r\r\n", "0\r\n\r\n"))
	for _, cl := range []string{"5, 5", "5,5", "+5", "-5", "0x5", "5.0", "5e0", "", "five", "1 2", "99999999999999999999",
		"\"5\"", "5\x00", "\u0665"} {
		add("content-length "+strconv.Quote(cl), refuse, post("Content-Length: "+cl+"\r\n", "hello"))
	}
	add("content-length differing", refuse, post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"))
	add("content-length space before colon", refuse, post("Content-Length : 5\r\n", "hello"))
	add("content-length obs-folded", either, post("Content-Length:\r\n 5\r\n", "hello"))

	// Chunk-size and chunk-line edge cases.
	badChunk := func(name, body string) { add(name, refuse, post("Transfer-Encoding: chunked\r\n", body)) }
	badChunk("chunk size overflow", "fffffffffffffffffff\r\nx\r\n0\r\n\r\n")
	badChunk("chunk size negative", "-5\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk size 0x", "0x5\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk size with junk", "5z\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk size empty", "\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk size with leading space", " 5\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk line bare lf", "5\nhello\r\n0\r\n\r\n")
	badChunk("chunk line bare cr", "5\rhello\r\n0\r\n\r\n")
	badChunk("chunk data longer than its size", "3\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk data shorter than its size", "8\r\nhello\r\n0\r\n\r\n")
	badChunk("chunk data without crlf", "5\r\nhello0\r\n\r\n")
	badChunk("chunk data bare lf", "5\r\nhello\n0\r\n\r\n")
	badChunk("last chunk bare lf", "5\r\nhello\r\n0\n\n")
	add("chunk extension with a nul", either, post("Transfer-Encoding: chunked\r\n", "5;a=\x00\r\nhello\r\n0\r\n\r\n"))
	badChunk("chunk extension with a bare lf", "5;a\nhello\r\n0\r\n\r\n")
	add("trailer obs-fold", either, post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX: a\r\n b\r\n\r\n"))
	add("trailer space before colon", either, post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX : a\r\n\r\n"))
	badChunk("trailer bare lf", "5\r\nhello\r\n0\r\nX: a\n\r\n")
	for _, f := range []string{"Content-Length", "Host", "X-Forwarded-For", "Transfer-Encoding"} {
		add("trailer: "+strings.ToLower(f), either, post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n"+f+": 1\r\n\r\n"))
	}

	// Bare LF, bare CR, and bytes in field names and values.
	add("bare cr in a field value", refuse, "GET /x HTTP/1.1\r\n"+host+"X: a\rb\r\n\r\n")
	add("bare cr ending a field", refuse, "GET /x HTTP/1.1\r\n"+host+"X: a\r\r\n\r\n")
	add("bare cr ending the head", refuse, "GET /x HTTP/1.1\r\n"+host+"\r\r\n")
	add("bare cr in the request line", refuse, "GET /x\rHTTP/1.1\r\n"+host+"\r\n")
	for _, c := range []byte{0, 1, 8, 0x0b, 0x0c, 0x1f, 0x7f} {
		add(fmt.Sprintf("byte %#x in a field value", c), refuse, "GET /x HTTP/1.1\r\n"+host+"X: a"+string(c)+"b\r\n\r\n")
	}
	for _, name := range []string{"X Y", "X\tY", "X(Y)", "X/Y", "X@Y", "X[Y]", "X\"Y", "X{Y}", "X\xe9", ""} {
		add("field name "+strconv.Quote(name), refuse, "GET /x HTTP/1.1\r\n"+host+name+": v\r\n\r\n")
	}
	add("field without a colon", refuse, "GET /x HTTP/1.1\r\n"+host+"X-No-Colon\r\n\r\n")
	add("obs-fold in a field value", either, "GET /x HTTP/1.1\r\n"+host+"X-Folded: a\r\n b\r\n\r\n")
	add("obs-fold with a tab", either, "GET /x HTTP/1.1\r\n"+host+"X-Folded: a\r\n\tb\r\n\r\n")
	add("whitespace before the first field", refuse, "GET /x HTTP/1.1\r\n "+host+"\r\n")
	add("leading empty line", either, "\r\nGET /x HTTP/1.1\r\n"+host+"\r\n")

	// Request lines.
	for _, line := range []string{"GET  /x HTTP/1.1", "GET /x  HTTP/1.1", "GET /x HTTP/1.1 ", " GET /x HTTP/1.1", "GET\t/x HTTP/1.1",
		"GET /x\tHTTP/1.1", "GET /x http/1.1", "GET /x HTTP/1.2", "GET /x HTTP/2.0", "GET /x HTTP/1", "GET /x HTTP/1.10",
		"GET /x HTTP/0.9", "GET /x", "GET", "G(T /x HTTP/1.1", "GET /x HTTP/1.1 extra", "GET /a b HTTP/1.1", "GET /\x00 HTTP/1.1",
		"GET /\x7f HTTP/1.1", "GET /x\xff HTTP/1.1x"} {
		add("request line "+strconv.Quote(line), refuse, line+"\r\n"+host+"\r\n")
	}
	add("connect", refuse, "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n")

	// Host.
	add("no host", refuse, "GET /x HTTP/1.1\r\n\r\n")
	add("two hosts", refuse, "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
	add("two hosts, same value", refuse, "GET /x HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n")
	for _, h := range []string{"a b", "a<b", "a\"b", "a/b", "a\\b", "a{b", "a|b", "a^b", "a`b"} {
		add("host "+strconv.Quote(h), refuse, "GET /x HTTP/1.1\r\nHost: "+h+"\r\n\r\n")
		if h != "a/b" && h != "a b" { // in a target, "/" starts the path and " " ends the target
			add("absolute-form host "+strconv.Quote(h), refuse, "GET http://"+h+"/x HTTP/1.1\r\n"+host+"\r\n")
		}
	}

	// Fragments.
	for _, target := range []string{"/exact#x", "/exact#", "/a?b=c#d", "http://a/exact#x", "/#"} {
		add("fragment "+target, refuse, "GET "+target+" HTTP/1.1\r\n"+host+"\r\n")
	}
	return vs
}

func manyFields(n, size int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-F%d: %s\r\n", i, strings.Repeat("f", size))
	}
	return b.String()
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// corpusUpstream answers every request with response (closing after it:
// each connection then carries what the engine sent for one request) and
// keeps every byte each connection received, until its end.
type corpusUpstream struct {
	ln     net.Listener
	mu     sync.Mutex
	done   *sync.Cond // signalled when a connection ends
	conns  [][]byte   // what each ended connection received
	active int        // connections being served
	// response is what the upstream writes once it has read a request
	// (a raw response vector); it then closes.
	response atomic.Pointer[string]
	// hangUp: close right after answering instead of recording what
	// follows (an engine may keep a connection it was not asked to close).
	hangUp atomic.Bool
}

func startCorpusUpstream(t *testing.T) *corpusUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &corpusUpstream{ln: ln}
	u.done = sync.NewCond(&u.mu)
	u.response.Store(strp("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.active++
			u.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				u.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return u
}

// serve reads one request (its head, and its body as far as it is framed
// plainly), answers, and records everything until the engine closes.
func (u *corpusUpstream) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var seen bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &seen))
	resp := *u.response.Load()
	if req, err := http.ReadRequest(br); err == nil {
		_, err = io.Copy(io.Discard, req.Body)
		if err == nil {
			_, _ = io.WriteString(c, resp)
		}
	}
	if !u.hangUp.Load() {
		_ = c.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, br)
	}
	u.mu.Lock()
	u.conns = append(u.conns, bytes.Clone(seen.Bytes()))
	u.active--
	u.done.Broadcast()
	u.mu.Unlock()
}

// take waits for the connections open now to end and returns what they
// received, forgetting it.
func (u *corpusUpstream) take() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	for u.active > 0 {
		u.done.Wait()
	}
	out := u.conns
	u.conns = nil
	return out
}

// corpusConfig is the policy both engines serve: every request is on a
// limited route (the limits never refuse: the corpus is about framing).
const corpusConfig = `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: ENGINE
  routes:
    - name: all
      match: {path_prefix: /}
      limits:
        - {name: per-ip, key: ip, rate: 1000000/s, burst: 1000000}
`

type corpusEngine struct {
	name Engine
	addr string
	up   *corpusUpstream
}

func startCorpusEngines(t *testing.T) []*corpusEngine {
	t.Helper()
	var out []*corpusEngine
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		up := startCorpusUpstream(t)
		cfg := decodeYAML(t, strings.ReplaceAll(corpusConfig, "ENGINE", string(e)), "http://"+up.ln.Addr().String())
		_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})
		out = append(out, &corpusEngine{name: e, addr: strings.TrimPrefix(base, "http://"), up: up})
	}
	return out
}

// clientExchange sends raw on a new connection and reads up to n
// responses (fewer when the engine closes), each whole; it returns their
// status codes and every byte received.
func clientExchange(addr, raw string, n int, methods []string, wait time.Duration) (statuses []int, err error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	go func() { _, _ = io.WriteString(c, raw) }()
	br := bufio.NewReader(c)
	for i := range n {
		method := "GET"
		if i < len(methods) {
			method = methods[i]
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			resp, err = http.ReadResponse(br, &http.Request{Method: method}) // an interim response: the final one follows
		}
		if err != nil {
			if i == 0 {
				return nil, err
			}
			return statuses, nil
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return statuses, fmt.Errorf("response %d body: %w", i, err)
		}
		statuses = append(statuses, resp.StatusCode)
		if resp.Close {
			break
		}
	}
	return statuses, nil
}

// outcome is one vector under one engine.
type outcome struct {
	accepted bool // the upstream got at least one complete message
	messages int
	statuses []int
	err      error
}

func (o outcome) String() string {
	return fmt.Sprintf("accepted %v (%d messages), client statuses %v, client error %v", o.accepted, o.messages, o.statuses, o.err)
}

// TestSmugglingCorpus runs every request vector through both engines.
func TestSmugglingCorpus(t *testing.T) {
	engines := startCorpusEngines(t)
	vectors := requestVectors()
	if len(vectors) < 200 {
		t.Fatalf("%d request vectors; the corpus should hold a few hundred", len(vectors))
	}
	accepted, refused := 0, 0
	for _, v := range vectors {
		max := max(v.messages, 1)
		var outs []outcome
		for _, e := range engines {
			start := time.Now()
			var o outcome
			// A vector to refuse gets a short wait: an engine may hold a
			// malformed body until its timeouts, and giving up early can
			// only leave the upstream with less. The others get a long
			// one: a client leaving early would look like a refusal.
			wait := 15 * time.Second
			if v.want == refuse {
				wait = 2 * time.Second
			}
			o.statuses, o.err = clientExchange(e.addr, v.raw, max, methodsOf(v.raw), wait)
			got := e.up.take()
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Logf("SLOW %s %s %v", v.name, e.name, d)
			}
			for i, msg := range got {
				m, err := strictMessage(msg, false)
				switch {
				case errors.Is(err, errIncomplete):
					continue // nothing the upstream could act on
				case err != nil:
					t.Errorf("%s: %s: upstream connection %d got an ambiguous message (%v): %q", v.name, e.name, i, err, trunc(string(msg)))
					continue
				}
				o.messages++
				if v.body != nil && o.messages == 1 && m.body != *v.body {
					t.Errorf("%s: %s: upstream body %q, want %q", v.name, e.name, trunc(m.body), trunc(*v.body))
				}
			}
			o.accepted = o.messages > 0
			if o.messages > max {
				t.Errorf("%s: %s: the upstream got %d messages, want at most %d", v.name, e.name, o.messages, max)
			}
			switch {
			case v.want == accept && (o.messages != max || len(o.statuses) != max || !allOK(o.statuses)):
				t.Errorf("%s: %s: want it forwarded intact (%d messages, %d answers 200): %v", v.name, e.name, max, max, o)
			case v.want == refuse && o.accepted:
				t.Errorf("%s: %s: want it refused: %v", v.name, e.name, o)
			case v.want == refuse && len(o.statuses) > 0 && o.statuses[0] < 400:
				t.Errorf("%s: %s: refused but answered %v", v.name, e.name, o.statuses)
			}
			outs = append(outs, o)
		}
		if outs[0].accepted != outs[1].accepted {
			if reason, ok := corpusDifferences[v.name]; ok {
				t.Logf("%s: accepted difference (%s): event loop %v; net/http %v", v.name, reason, outs[0], outs[1])
			} else {
				t.Errorf("%s: the engines disagree: event loop %v; net/http %v", v.name, outs[0], outs[1])
			}
		} else if _, ok := corpusDifferences[v.name]; ok {
			t.Errorf("%s: listed in corpusDifferences but both engines agree (%v): remove it", v.name, outs[0])
		}
		if outs[0].accepted {
			accepted++
		} else {
			refused++
		}
	}
	t.Logf("%d request vectors: the event loop forwarded %d, refused %d", len(vectors), accepted, refused)
}

func allOK(statuses []int) bool {
	for _, s := range statuses {
		if s != http.StatusOK {
			return false
		}
	}
	return true
}

// methodsOf lists the methods of the requests in raw (for reading HEAD
// answers), as far as they are plain to see.
func methodsOf(raw string) []string {
	var out []string
	for _, line := range strings.Split(raw, "\n") {
		if m, _, ok := strings.Cut(line, " "); ok && strings.HasSuffix(strings.TrimSuffix(line, "\r"), "HTTP/1.1") {
			out = append(out, m)
		}
	}
	return out
}

// errIncomplete: the bytes end before the message does.
var errIncomplete = errors.New("incomplete message")

type strict struct {
	startLine string
	fields    [][2]string
	body      string
}

// strictMessage parses raw as exactly one HTTP/1.1 message, as strictly as
// RFC 9112 reads: CRLF line ends only, no obs-fold, token field names,
// field values without CTLs, at most one Content-Length (1*DIGIT without
// leading zeros), Transfer-Encoding only as exactly "chunked" and never
// with Content-Length, a Connection field naming neither, a strict chunked
// body, and no byte after the message. A request must have exactly one
// Host. It returns errIncomplete when raw is a proper prefix of such a
// message.
func strictMessage(raw []byte, response bool) (strict, error) {
	var m strict
	s := string(raw)
	end := strings.Index(s, "\r\n\r\n")
	if end < 0 {
		if err := strictLines(s); err != nil {
			return m, err
		}
		return m, errIncomplete
	}
	head, rest := s[:end+2], s[end+4:]
	if err := strictLines(head); err != nil {
		return m, err
	}
	lines := strings.Split(strings.TrimSuffix(head, "\r\n"), "\r\n")
	m.startLine = lines[0]
	if !response {
		parts := strings.Split(m.startLine, " ")
		if len(parts) != 3 || parts[0] == "" || strings.ContainsFunc(parts[0], func(r rune) bool { return !isTokenRune(r) }) ||
			parts[1] == "" || strings.ContainsAny(parts[1], "#") || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
			return m, fmt.Errorf("request line %q", m.startLine)
		}
	} else if !strings.HasPrefix(m.startLine, "HTTP/1.1 ") || len(m.startLine) < 12 || m.startLine[12:13] != "" && m.startLine[12] != ' ' {
		return m, fmt.Errorf("status line %q", m.startLine)
	}
	var cl, te, hosts int
	length := int64(-1)
	for _, line := range lines[1:] {
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || strings.ContainsFunc(name, func(r rune) bool { return !isTokenRune(r) }) {
			return m, fmt.Errorf("field line %q", line)
		}
		value = strings.Trim(value, " \t")
		for i := range len(value) {
			if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
				return m, fmt.Errorf("field %q: byte %#x", name, c)
			}
		}
		m.fields = append(m.fields, [2]string{name, value})
		switch strings.ToLower(name) {
		case "content-length":
			cl++
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 || value != strconv.FormatInt(n, 10) {
				return m, fmt.Errorf("content-length %q", value)
			}
			length = n
		case "transfer-encoding":
			te++
			if value != "chunked" {
				return m, fmt.Errorf("transfer-encoding %q", value)
			}
		case "host":
			hosts++
		case "connection":
			for _, tok := range strings.Split(value, ",") {
				switch strings.ToLower(strings.TrimSpace(tok)) {
				case "content-length", "transfer-encoding", "host":
					return m, fmt.Errorf("connection names %q", tok)
				}
			}
		}
	}
	switch {
	case cl > 1 || te > 1 || cl > 0 && te > 0:
		return m, fmt.Errorf("framing fields: %d content-length, %d transfer-encoding", cl, te)
	case !response && hosts != 1:
		return m, fmt.Errorf("%d host fields", hosts)
	}
	switch {
	case te == 1:
		body, n, err := strictChunked(rest)
		if err != nil {
			return m, err
		}
		if n != len(rest) {
			return m, fmt.Errorf("%d bytes after the chunked body: %q", len(rest)-n, trunc(rest[n:]))
		}
		m.body = body
	case length >= 0:
		if int64(len(rest)) < length {
			return m, errIncomplete
		}
		if int64(len(rest)) > length {
			return m, fmt.Errorf("%d bytes after the body: %q", int64(len(rest))-length, trunc(rest[length:]))
		}
		m.body = rest[:length]
	case !response && rest != "":
		return m, fmt.Errorf("%d bytes after a message without a body: %q", len(rest), trunc(rest))
	default:
		m.body = rest // a response's body up to the connection's end
	}
	return m, nil
}

// strictLines checks that every line end is CRLF.
func strictLines(s string) error {
	for i := range len(s) {
		switch s[i] {
		case '\n':
			if i == 0 || s[i-1] != '\r' {
				return fmt.Errorf("bare lf at %d", i)
			}
		case '\r':
			if i+1 < len(s) && s[i+1] != '\n' {
				return fmt.Errorf("bare cr at %d", i)
			}
		}
	}
	return nil
}

// strictChunked decodes a chunked body at the start of s: hex sizes,
// extensions without CTLs, CRLF everywhere, trailer fields. It returns the
// data and the body's length, or errIncomplete.
func strictChunked(s string) (string, int, error) {
	var data strings.Builder
	pos := 0
	for {
		eol := strings.Index(s[pos:], "\r\n")
		if eol < 0 {
			return "", 0, errIncomplete
		}
		line := s[pos : pos+eol]
		size, ext, _ := strings.Cut(line, ";")
		size = strings.TrimRight(size, " \t")
		n, err := strconv.ParseUint(size, 16, 62)
		if err != nil || size == "" || strings.ContainsAny(size, "+-xX_") {
			return "", 0, fmt.Errorf("chunk size %q", line)
		}
		if strings.ContainsFunc(ext, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
			return "", 0, fmt.Errorf("chunk extension %q", line)
		}
		pos += eol + 2
		if n == 0 {
			break
		}
		if uint64(len(s)-pos) < n+2 {
			return "", 0, errIncomplete
		}
		data.WriteString(s[pos : pos+int(n)])
		pos += int(n)
		if s[pos:pos+2] != "\r\n" {
			return "", 0, fmt.Errorf("no crlf after chunk data")
		}
		pos += 2
	}
	for {
		eol := strings.Index(s[pos:], "\r\n")
		if eol < 0 {
			return "", 0, errIncomplete
		}
		line := s[pos : pos+eol]
		pos += eol + 2
		if line == "" {
			return data.String(), pos, nil
		}
		name, _, ok := strings.Cut(line, ":")
		if !ok || name == "" || strings.ContainsFunc(name, func(r rune) bool { return !isTokenRune(r) }) {
			return "", 0, fmt.Errorf("trailer line %q", line)
		}
		switch strings.ToLower(name) {
		case "content-length", "transfer-encoding", "host", "x-forwarded-for":
			return "", 0, fmt.Errorf("trailer field %q", name)
		}
	}
}

func isTokenRune(r rune) bool {
	return r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

type responseVector struct {
	name, raw string
	want      want   // accept: relayed whole; refuse: 502 or cut off
	body      string // for accept: the body the client must get
	head      bool   // the request is a HEAD
}

// responseDifferences are the response vectors on which the engines may
// disagree, with the reason.
var responseDifferences = map[string]string{
	"http/1.0 with transfer-encoding": "net/http ignores Transfer-Encoding in an HTTP/1.0 response and relays the bytes close-delimited; the event loop answers 502 (RFC 9112 6.1: faulty framing)",
	"obs-fold":                        "net/http's client unfolds the field; the event loop answers 502 rather than change the bytes it relays",
}

func responseVectors() []responseVector {
	var vs []responseVector
	ok := func(name, raw, body string) {
		vs = append(vs, responseVector{name: name, raw: raw, want: accept, body: body})
	}
	bad := func(name, raw string) { vs = append(vs, responseVector{name: name, raw: raw, want: refuse}) }
	odd := func(name, raw string) { vs = append(vs, responseVector{name: name, raw: raw, want: either}) }
	const h = "HTTP/1.1 200 OK\r\n"
	ok("content-length", h+"Content-Length: 2\r\n\r\nok", "ok")
	ok("content-length 0", h+"Content-Length: 0\r\n\r\n", "")
	ok("content-length with leading zeros", h+"Content-Length: 002\r\n\r\nok", "ok")
	ok("content-length repeated", h+"Content-Length: 2\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("content-length with ows", h+"Content-Length:  2 \r\n\r\nok", "ok")
	ok("chunked", h+"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", "ok")
	ok("chunked, several", h+"Transfer-Encoding: chunked\r\n\r\n1\r\no\r\n1\r\nk\r\n0\r\n\r\n", "ok")
	ok("mixed-case chunked", h+"Transfer-Encoding: cHuNkEd\r\n\r\n2\r\nok\r\n0\r\n\r\n", "ok")
	ok("chunk extensions", h+"Transfer-Encoding: chunked\r\n\r\n2;a=b;c=\"d e\"\r\nok\r\n0;z\r\n\r\n", "ok")
	ok("chunked uppercase hex, leading zeros", h+"Transfer-Encoding: chunked\r\n\r\n00A\r\n0123456789\r\n00\r\n\r\n", "0123456789")
	ok("chunked with trailers", h+"Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\n\r\n", "ok")
	ok("chunked overrides content-length", h+"Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", "ok")
	ok("close-delimited", h+"\r\nuntil the end", "until the end")
	ok("close-delimited with connection close", h+"Connection: close\r\n\r\nuntil the end", "until the end")
	ok("http/1.0 with content-length", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("http/1.0 close-delimited", "HTTP/1.0 200 OK\r\n\r\nold", "old")
	ok("no reason phrase", "HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("no reason phrase, no space", "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("two spaces before the status code", "HTTP/1.1  200 OK x\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("odd reason phrase", "HTTP/1.1 200 Fine, \xe9 really\t\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("status 299", "HTTP/1.1 299 Whatever\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("status 404", "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno", "no")
	ok("status 500", "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno", "no")
	ok("status 599", "HTTP/1.1 599 Custom\r\nContent-Length: 2\r\n\r\nno", "no")
	ok("100 continue first", "HTTP/1.1 100 Continue\r\n\r\n"+h+"Content-Length: 2\r\n\r\nok", "ok")
	ok("103 early hints first", "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"+h+"Content-Length: 2\r\n\r\nok", "ok")
	ok("two interim responses", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"+h+"Content-Length: 2\r\n\r\nok", "ok")
	ok("connection names content-length", h+"Connection: Content-Length\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("connection names transfer-encoding", h+"Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", "ok")
	ok("connection names a field", h+"Connection: X-Hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("keep-alive fields", h+"Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("set-cookie twice", h+"Set-Cookie: a=1\r\nSet-Cookie: b=2; HttpOnly\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("long field", h+"X-Long: "+strings.Repeat("l", 8000)+"\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("100 fields", h+manyFields(100, 10)+"Content-Length: 2\r\n\r\nok", "ok")
	ok("obs-text in a value", h+"X-Obs: caf\xe9\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("empty value", h+"X-Empty:\r\nContent-Length: 2\r\n\r\nok", "ok")
	ok("response splitting: a second response after the body", h+"Content-Length: 2\r\n\r\nok"+
		"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil", "ok")
	ok("response splitting: a second response after the chunks", h+"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"+
		"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil", "ok")
	odd("bare lf response", "HTTP/1.1 200 OK\nContent-Length: 2\n\nok")
	vs = append(vs, responseVector{name: "head with content-length", raw: h + "Content-Length: 10\r\n\r\n", want: accept, head: true},
		responseVector{name: "head chunked", raw: h + "Transfer-Encoding: chunked\r\n\r\n", want: accept, head: true},
		responseVector{name: "204", raw: "HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", want: accept},
		responseVector{name: "304", raw: "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", want: accept})

	for _, cl := range []string{"-1", "+2", "0x2", "two", "2, 2", "", "99999999999999999999", "2 2"} {
		bad("content-length "+strconv.Quote(cl), h+"Content-Length: "+cl+"\r\n\r\nok")
	}
	bad("content-length differing", h+"Content-Length: 2\r\nContent-Length: 3\r\n\r\nok!")
	for _, te := range []string{"gzip", "chunked, gzip", "gzip, chunked", "identity", "chunked,", "x", ""} {
		bad("transfer-encoding "+strconv.Quote(te), h+"Transfer-Encoding: "+te+"\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	}
	bad("transfer-encoding twice", h+"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	odd("http/1.0 with transfer-encoding", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	for _, line := range []string{"HTTP/1.1 2000 OK", "HTTP/1.1 20 OK", "HTTP/2.0 200 OK", "http/1.1 200 OK", "HTTP/1.1 OK",
		"HTTP/1.2 200 OK", "HTTP/1.1 abc OK", "ICY 200 OK", "HTTP/1.1 200OK"} {
		bad("status line "+strconv.Quote(line), line+"\r\nContent-Length: 2\r\n\r\nok")
	}
	odd("status 099", "HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok")
	odd("ctl in the reason phrase", "HTTP/1.1 200 O\x01K\r\nContent-Length: 2\r\n\r\nok")
	odd("obs-fold", h+"X-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok")
	odd("whitespace before a colon", h+"X-Sp : a\r\nContent-Length: 2\r\n\r\nok")
	bad("nul in a value", h+"X-Nul: a\x00b\r\nContent-Length: 2\r\n\r\nok")
	bad("bare cr in a value", h+"X-Cr: a\rb\r\nContent-Length: 2\r\n\r\nok")
	bad("field name with a space", h+"X Y: a\r\nContent-Length: 2\r\n\r\nok")
	bad("101 to a request without upgrade", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	bad("no response", "")
	bad("a head cut short", h+"Content-Length: 2\r\n")
	// Cut off after the head: the client has a 200 it cannot finish.
	bad("body shorter than its content-length", h+"Content-Length: 10\r\n\r\nok")
	bad("chunk size invalid", h+"Transfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n")
	bad("chunk data longer than its size", h+"Transfer-Encoding: chunked\r\n\r\n1\r\nok\r\n0\r\n\r\n")
	bad("chunked without its end", h+"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n")
	return vs
}

// TestSmugglingCorpusResponses runs every response vector (the upstream's
// answer to a GET) through both engines: the client gets exactly one
// unambiguous response, the upstream's relayed whole or a 502, or a
// response cut off (its head already relayed); both engines alike.
func TestSmugglingCorpusResponses(t *testing.T) {
	engines := startCorpusEngines(t)
	for _, e := range engines {
		e.up.hangUp.Store(true)
	}
	for _, v := range responseVectors() {
		var outs []string
		for _, e := range engines {
			e.up.response.Store(strp(v.raw))
			method := "GET"
			if v.head {
				method = "HEAD"
			}
			start := time.Now()
			got, err := readAll(e.addr, method+" /r HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
			e.up.take()
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Logf("SLOW %s %s %v", v.name, e.name, d)
			}
			outcome, body, cerr := classifyResponse(got, v.head)
			if cerr != nil {
				t.Errorf("%s: %s: the client got an ambiguous response (%v): %q", v.name, e.name, cerr, trunc(string(got)))
				continue
			}
			switch {
			case v.want == accept && (outcome != "relayed" || body != v.body):
				t.Errorf("%s: %s: want it relayed with body %q: %s, body %q, read error %v", v.name, e.name, v.body, outcome, trunc(body), err)
			case v.want == refuse && outcome == "relayed":
				t.Errorf("%s: %s: want a 502 or a cut, got it relayed: %q", v.name, e.name, trunc(string(got)))
			}
			outs = append(outs, outcome)
		}
		if len(outs) == 2 && outs[0] != outs[1] {
			if reason, ok := responseDifferences[v.name]; ok {
				t.Logf("%s: accepted difference (%s): event loop %s, net/http %s", v.name, reason, outs[0], outs[1])
			} else {
				t.Errorf("%s: the engines disagree: event loop %s, net/http %s", v.name, outs[0], outs[1])
			}
		} else if _, ok := responseDifferences[v.name]; ok && len(outs) == 2 {
			t.Errorf("%s: listed in responseDifferences but both engines agree (%s): remove it", v.name, outs[0])
		}
	}
}

// readAll sends req on a new connection and returns every byte received
// until the engine closes (the request asks it to).
func readAll(addr, req string) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return nil, err
	}
	return io.ReadAll(c)
}

// classifyResponse checks what a client got: interim responses, then
// exactly one response, strictly framed. It is "relayed" (any status but
// 502), "502", or "cut" (a head, then less body than it announced).
func classifyResponse(got []byte, head bool) (outcome, body string, err error) {
	rest := got
	for {
		m, err := strictMessage(rest, true)
		interim := len(m.startLine) >= 12 && m.startLine[9] == '1' && !errors.Is(err, errIncomplete)
		if interim && m.startLine[9:12] != "101" {
			// An interim response has no body: the final one follows it.
			n := strings.Index(string(rest), "\r\n\r\n") + 4
			rest = rest[n:]
			continue
		}
		if head {
			// A HEAD response's framing fields describe a body not sent.
			n := strings.Index(string(rest), "\r\n\r\n")
			if n < 0 || n+4 != len(rest) {
				return "", "", fmt.Errorf("head response with a body")
			}
			return "relayed", "", nil
		}
		switch {
		case errors.Is(err, errIncomplete):
			return "cut", "", nil
		case err != nil:
			return "", "", err
		case strings.HasPrefix(m.startLine, "HTTP/1.1 502 "):
			return "502", m.body, nil
		}
		return "relayed", m.body, nil
	}
}
