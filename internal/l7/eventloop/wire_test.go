package eventloop

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// wrkRequest is what wrk sends by default.
const wrkRequest = "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"

// browserRequest is a typical browser request through a proxy.
const browserRequest = "GET /api/v1/items?page=2&sort=desc HTTP/1.1\r\n" +
	"Host: shop.example.com\r\n" +
	"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n" +
	"Accept: application/json, text/plain, */*\r\n" +
	"Accept-Language: en-US,en;q=0.5\r\n" +
	"Accept-Encoding: gzip, deflate, br\r\n" +
	"Connection: keep-alive\r\n" +
	"Referer: https://shop.example.com/items\r\n" +
	"Cookie: session=0123456789abcdef; theme=dark\r\n" +
	"X-Forwarded-For: 198.18.0.7\r\n" +
	"\r\n"

// requestWant is what a request head parses into; status is the wireError
// status when the head is rejected, 0 when it is accepted.
type requestWant struct {
	status         int
	incomplete     bool
	n              int // 0: the whole input
	method, target string
	minor          int
	contentLength  int64
	chunked        bool
	keepAlive      bool
	expectContinue bool
	upgrade        bool
	host           *string
	connection     []string
	headers        int // number of header fields; -1: not checked
}

func str(s string) *string { return &s }

type requestCase struct {
	name string
	in   string
	max  int // 0: 64 KiB
	want requestWant
}

// get11 builds an accepted GET / HTTP/1.1 expectation with Host: a.
func get11(change func(*requestWant)) requestWant {
	w := requestWant{method: "GET", target: "/", minor: 1, contentLength: -1, keepAlive: true, host: str("a"), headers: -1}
	if change != nil {
		change(&w)
	}
	return w
}

func rejected(status int) requestWant { return requestWant{status: status} }

func requestCases() []requestCase {
	many := func(n int) string {
		var b strings.Builder
		b.WriteString("GET / HTTP/1.1\r\nHost: a\r\n")
		for i := 1; i < n; i++ {
			fmt.Fprintf(&b, "X-F%d: v\r\n", i)
		}
		b.WriteString("\r\n")
		return b.String()
	}
	return []requestCase{
		// Accepted heads.
		{"wrk", wrkRequest, 0, get11(func(w *requestWant) { w.host = str("127.0.0.1:8080"); w.headers = 1 })},
		{"browser", browserRequest, 0, requestWant{method: "GET", target: "/api/v1/items?page=2&sort=desc", minor: 1,
			contentLength: -1, keepAlive: true, host: str("shop.example.com"), connection: []string{"keep-alive"}, headers: 9}},
		{"bare lf line ends", "GET / HTTP/1.1\nHost: a\n\n", 0, get11(nil)},
		{"mixed line ends", "GET / HTTP/1.1\r\nHost: a\n\r\n", 0, get11(nil)},
		{"body bytes after the head", "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET", 0,
			get11(func(w *requestWant) {
				w.method, w.target, w.contentLength, w.n = "POST", "/x", 3, len("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n")
			})},
		{"one leading empty line", "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 0, get11(nil)},
		{"four leading empty lines", "\r\n\n\r\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 0, get11(nil)},
		{"five leading empty lines", "\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"http/1.0 closes", "GET / HTTP/1.0\r\n\r\n", 0, requestWant{method: "GET", target: "/", contentLength: -1, headers: 0}},
		{"http/1.0 keep-alive", "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 0,
			requestWant{method: "GET", target: "/", contentLength: -1, keepAlive: true, connection: []string{"Keep-Alive"}, headers: 1}},
		{"http/1.0 keep-alive and close", "GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", 0,
			requestWant{method: "GET", target: "/", contentLength: -1, connection: []string{"keep-alive", "close"}, headers: 2}},
		{"http/1.1 close in a list", "GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, ,CLOSE\t\r\n\r\n", 0,
			get11(func(w *requestWant) { w.keepAlive, w.connection = false, []string{"foo", "CLOSE"} })},
		{"ows trimmed", "GET / HTTP/1.1\r\nHost: \t a \t\r\nX: \t\r\n\r\n", 0, get11(nil)},
		{"obs-text and htab in a value", "GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\tok\r\n\r\n", 0, get11(nil)},
		{"empty host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", 0, get11(func(w *requestWant) { w.host = str("") })},
		{"host case-insensitive", "GET / HTTP/1.1\r\nhOST: a\r\n\r\n", 0, get11(nil)},
		{"ipv6 host", "GET / HTTP/1.1\r\nHost: [fd00::1]:80\r\n\r\n", 0, get11(func(w *requestWant) { w.host = str("[fd00::1]:80") })},
		{"absolute-form", "GET http://a/b HTTP/1.1\r\nHost: a\r\n\r\n", 0, get11(func(w *requestWant) { w.target = "http://a/b" })},
		{"authority-form", "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 0, get11(func(w *requestWant) { w.method, w.target = "CONNECT", "a:443" })},
		{"asterisk-form", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 0, get11(func(w *requestWant) { w.method, w.target = "OPTIONS", "*" })},
		{"extension method", "M-SEARCH! / HTTP/1.1\r\nHost: a\r\n\r\n", 0, get11(func(w *requestWant) { w.method = "M-SEARCH!" })},
		{"content-length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 42\r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.contentLength = "POST", 42 })},
		{"content-length zero", "POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 0\r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.contentLength = "POST", 0 })},
		{"content-length max", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775807\r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.contentLength = "POST", 1<<63-1 })},
		{"content-length repeated", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\nContent-Length:  7 \r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.contentLength = "POST", 7 })},
		{"chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.chunked = "POST", true })},
		{"chunked any case", "POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding:  CHUNKED \r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.chunked = "POST", true })},
		{"expect 100-continue", "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n", 0,
			get11(func(w *requestWant) { w.method, w.contentLength, w.expectContinue = "PUT", 1, true })},
		{"expect something else", "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", 0, get11(func(w *requestWant) { w.method = "PUT" })},
		{"upgrade", "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n", 0,
			get11(func(w *requestWant) {
				w.target, w.upgrade, w.connection = "/ws", true, []string{"keep-alive", "Upgrade"}
			})},
		{"upgrade field without the token", "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n", 0, get11(nil)},
		{"upgrade token without the field", "GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n", 0,
			get11(func(w *requestWant) { w.connection = []string{"upgrade"} })},
		{"128 fields", many(128), 0, get11(func(w *requestWant) { w.headers = 128 })},

		// Request line.
		{"no version", "GET /\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"two spaces", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"space after version", "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"empty method", " / HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"method not a token", "GE@T / HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"tab separator", "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"ctl in target", "GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"del in target", "GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"bare cr in request line", "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"cr cr lf after version", "GET / HTTP/1.1\r\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"lowercase version", "GET / http/1.1\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"long version", "GET / HTTP/1.10\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"version garbage", "GET / HTTP/1.x\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"http/2.0", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 0, rejected(505)},
		{"http/1.2", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", 0, rejected(505)},
		{"http/0.9", "GET / HTTP/0.9\r\n\r\n", 0, rejected(505)},
		{"h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 0, rejected(505)},

		// Header fields.
		{"whitespace before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 0, rejected(400)},
		{"tab before colon", "GET / HTTP/1.1\r\nHost: a\r\nX\t: b\r\n\r\n", 0, rejected(400)},
		{"empty name", "GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", 0, rejected(400)},
		{"no colon", "GET / HTTP/1.1\r\nHost: a\r\nfoo bar\r\n\r\n", 0, rejected(400)},
		{"obs-text in name", "GET / HTTP/1.1\r\nHost: a\r\nX\xe9: b\r\n\r\n", 0, rejected(400)},
		{"nul in value", "GET / HTTP/1.1\r\nHost: a\r\nX: b\x00c\r\n\r\n", 0, rejected(400)},
		{"del in value", "GET / HTTP/1.1\r\nHost: a\r\nX: b\x7f\r\n\r\n", 0, rejected(400)},
		{"bare cr in value", "GET / HTTP/1.1\r\nHost: a\r\nX: b\rc\r\n\r\n", 0, rejected(400)},
		{"cr cr lf after value", "GET / HTTP/1.1\r\nHost: a\r\nX: b\r\r\n\r\n", 0, rejected(400)},
		{"bare cr as blank line", "GET / HTTP/1.1\r\nHost: a\r\n\rX\r\n\r\n", 0, rejected(400)},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n c\r\n\r\n", 0, rejected(400)},
		{"obs-fold with tab", "GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n\tc\r\n\r\n", 0, rejected(400)},
		{"whitespace before the first field", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", 0, rejected(400)},
		{"129 fields", many(129), 0, rejected(431)},

		// Content-Length.
		{"content-length sign", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", 0, rejected(400)},
		{"content-length negative", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 0, rejected(400)},
		{"content-length hex", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n", 0, rejected(400)},
		{"content-length inner space", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\n", 0, rejected(400)},
		{"content-length list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", 0, rejected(400)},
		{"content-length empty", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", 0, rejected(400)},
		{"content-length overflow", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\n", 0, rejected(400)},
		{"content-length differing", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 0, rejected(400)},
		{"content-length same number other bytes", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\n", 0, rejected(400)},

		// Transfer-Encoding.
		{"gzip", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 0, rejected(501)},
		{"gzip, chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 0, rejected(501)},
		{"chunked, chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 0, rejected(501)},
		{"chunked twice", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 0, rejected(501)},
		{"chunked with a parameter", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", 0, rejected(501)},
		{"chunked with an empty list element", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked,\r\n\r\n", 0, rejected(501)},
		{"identity", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", 0, rejected(501)},
		{"empty transfer-encoding", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n", 0, rejected(400)},
		{"chunked with content-length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 0, rejected(400)},
		{"chunked in http/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 0, rejected(400)},

		// Host.
		{"missing host", "GET / HTTP/1.1\r\nX: a\r\n\r\n", 0, rejected(400)},
		{"missing host for connect", "CONNECT a:443 HTTP/1.1\r\n\r\n", 0, rejected(400)},
		{"two equal hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 0, rejected(400)},
		{"host with a space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 0, rejected(400)},
		{"host with a slash", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 0, rejected(400)},
		{"host with obs-text", "GET / HTTP/1.1\r\nHost: caf\xc3\xa9\r\n\r\n", 0, rejected(400)},

		// Limits and incomplete heads.
		{"incomplete", "GET / HTTP/1.1\r\nHost: a\r\n", 0, requestWant{incomplete: true}},
		{"incomplete before a cr", "GET / HTTP/1.1\r\nHost: a\r\n\r", 0, requestWant{incomplete: true}},
		{"only empty lines", "\r\n\r\n", 0, requestWant{incomplete: true}},
		{"empty", "", 0, requestWant{incomplete: true}},
		{"head exactly max", wrkRequest, len(wrkRequest), get11(func(w *requestWant) { w.host = str("127.0.0.1:8080") })},
		{"head over max", wrkRequest, len(wrkRequest) - 1, rejected(431)},
		{"incomplete head over max", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("b", 100), 64, rejected(431)},
		{"incomplete head within max", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("b", 30), 64, requestWant{incomplete: true}},
		{"early error in an incomplete head", "GET / HTTP/1.1\r\nHost: a\r\nX\x00", 0, rejected(400)},
		{"early version error", "GET / HTTP/1.1xxxxxx", 0, rejected(400)},
	}
}

func TestParseRequestHead(t *testing.T) {
	var h requestHead // shared, so that stale state from one case would show in the next
	for _, tc := range requestCases() {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = 64 << 10
			}
			n, err := parseRequestHead([]byte(tc.in), &h, max)
			checkRequestHead(t, tc.in, n, err, &h, tc.want)
		})
	}
}

func checkRequestHead(t *testing.T, in string, n int, err error, h *requestHead, want requestWant) {
	t.Helper()
	if want.status != 0 {
		var we *wireError
		if !errors.As(err, &we) {
			t.Fatalf("parse = %d, %v; want a wireError with status %d", n, err, want.status)
		}
		if we.status != want.status || n != 0 {
			t.Fatalf("parse = %d, %v (status %d); want status %d", n, err, we.status, want.status)
		}
		return
	}
	if want.incomplete {
		if n != 0 || err != nil {
			t.Fatalf("parse = %d, %v; want 0, nil (incomplete)", n, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	wantN := want.n
	if wantN == 0 {
		wantN = len(in)
	}
	if n != wantN {
		t.Errorf("n = %d, want %d", n, wantN)
	}
	if string(h.method) != want.method || string(h.target) != want.target || h.minor != want.minor {
		t.Errorf("request line = %q %q 1.%d, want %q %q 1.%d", h.method, h.target, h.minor, want.method, want.target, want.minor)
	}
	if h.contentLength != want.contentLength || h.chunked != want.chunked {
		t.Errorf("contentLength, chunked = %d, %v, want %d, %v", h.contentLength, h.chunked, want.contentLength, want.chunked)
	}
	if h.keepAlive != want.keepAlive || h.expectContinue != want.expectContinue || h.upgrade != want.upgrade {
		t.Errorf("keepAlive, expectContinue, upgrade = %v, %v, %v, want %v, %v, %v",
			h.keepAlive, h.expectContinue, h.upgrade, want.keepAlive, want.expectContinue, want.upgrade)
	}
	switch {
	case want.host == nil && h.host != nil:
		t.Errorf("host = %q, want none", h.host)
	case want.host != nil && (h.host == nil || string(h.host) != *want.host):
		t.Errorf("host = %q (nil %v), want %q", h.host, h.host == nil, *want.host)
	}
	var connection []string
	for _, token := range h.connection {
		connection = append(connection, string(token))
	}
	if fmt.Sprint(connection) != fmt.Sprint(want.connection) {
		t.Errorf("connection = %q, want %q", connection, want.connection)
	}
	if want.headers >= 0 && len(h.headers) != want.headers {
		t.Errorf("%d header fields, want %d", len(h.headers), want.headers)
	}
}

func TestParseRequestHeadFields(t *testing.T) {
	in := "GET / HTTP/1.1\r\nHost:  a \r\nX-Empty:\r\nX-Tab:\tb\tc\t\r\nx-lower: d\r\n\r\n"
	var h requestHead
	if _, err := parseRequestHead([]byte(in), &h, 1024); err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"Host", "a"}, {"X-Empty", ""}, {"X-Tab", "b\tc"}, {"x-lower", "d"}}
	if len(h.headers) != len(want) {
		t.Fatalf("%d fields, want %d", len(h.headers), len(want))
	}
	for i, f := range h.headers {
		if string(f.name) != want[i][0] || string(f.value) != want[i][1] {
			t.Errorf("field %d = %q: %q, want %q: %q", i, f.name, f.value, want[i][0], want[i][1])
		}
	}
}

// TestParseRequestHeadPrefixes checks that every proper prefix of an accepted
// head is incomplete, never an error, and never a shorter head.
func TestParseRequestHeadPrefixes(t *testing.T) {
	var h requestHead
	for _, tc := range requestCases() {
		if tc.want.status != 0 || tc.want.incomplete || tc.max != 0 {
			continue
		}
		end := tc.want.n
		if end == 0 {
			end = len(tc.in)
		}
		for i := range end {
			n, err := parseRequestHead([]byte(tc.in[:i]), &h, 64<<10)
			if n != 0 || err != nil {
				t.Errorf("%s: prefix of %d bytes = %d, %v; want 0, nil", tc.name, i, n, err)
				break
			}
		}
	}
}

type responseWant struct {
	status        int // wireError status; 0 accepted
	incomplete    bool
	code          int
	reason        string
	minor         int
	contentLength int64
	chunked       bool
	keepAlive     bool
}

type responseCase struct {
	name string
	in   string
	want responseWant
}

func ok11(code int, reason string, change func(*responseWant)) responseWant {
	w := responseWant{code: code, reason: reason, minor: 1, contentLength: -1, keepAlive: true}
	if change != nil {
		change(&w)
	}
	return w
}

func responseCases() []responseCase {
	many := func(n int) string {
		var b strings.Builder
		b.WriteString("HTTP/1.1 200 OK\r\n")
		for i := range n {
			fmt.Fprintf(&b, "X-F%d: v\r\n", i)
		}
		b.WriteString("\r\n")
		return b.String()
	}
	bad := responseWant{status: 502}
	return []responseCase{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", ok11(200, "OK", func(w *responseWant) { w.contentLength = 5 })},
		{"bare lf", "HTTP/1.1 200 OK\nContent-Length: 5\n\n", ok11(200, "OK", func(w *responseWant) { w.contentLength = 5 })},
		{"no reason", "HTTP/1.1 204\r\n\r\n", ok11(204, "", nil)},
		{"empty reason", "HTTP/1.1 304 \r\n\r\n", ok11(304, "", nil)},
		{"reason with spaces", "HTTP/1.1 404 Not  Found \r\n\r\n", ok11(404, "Not  Found ", nil)},
		{"reason with obs-text and tab", "HTTP/1.1 200 \xc3\xa7a\tva\r\n\r\n", ok11(200, "\xc3\xa7a\tva", nil)},
		{"two spaces before the code", "HTTP/1.1  200 OK\r\n\r\n", ok11(200, "OK", nil)},
		{"status 100", "HTTP/1.1 100 Continue\r\n\r\n", ok11(100, "Continue", nil)},
		{"status 999", "HTTP/1.1 999 Odd\r\n\r\n", ok11(999, "Odd", nil)},
		{"http/1.0 closes", "HTTP/1.0 200 OK\r\n\r\n", responseWant{code: 200, reason: "OK", contentLength: -1}},
		{"http/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
			responseWant{code: 200, reason: "OK", contentLength: 0, keepAlive: true}},
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", ok11(200, "OK", func(w *responseWant) { w.keepAlive = false })},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", ok11(200, "OK", func(w *responseWant) { w.chunked = true })},
		{"chunked overrides content-length", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n",
			ok11(200, "OK", func(w *responseWant) { w.chunked = true })},
		// Only exactly one "chunked" is relayed (as net/http's Transport
		// takes it); another coding, a list, two fields: 502.
		{"chunked last of a list", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip,\r\nTransfer-Encoding: , Chunked\r\n\r\n", bad},
		{"gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\n", bad},
		{"chunked not last", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", bad},
		{"chunked, with an empty element", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n", bad},
		{"mixed-case chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: ChUnKeD\r\n\r\n",
			ok11(200, "OK", func(w *responseWant) { w.chunked = true })},
		{"chunked overrides content-length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
			ok11(200, "OK", func(w *responseWant) { w.chunked = true })},
		{"repeated content-length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
			ok11(200, "OK", func(w *responseWant) { w.contentLength = 3 })},
		{"body after the head", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", ok11(200, "OK", func(w *responseWant) { w.contentLength = 3 })},
		{"128 fields", many(128), ok11(200, "OK", nil)},

		{"status below 100", "HTTP/1.1 099 Low\r\n\r\n", bad},
		{"two-digit status", "HTTP/1.1 20 OK\r\n\r\n", bad},
		{"four-digit status", "HTTP/1.1 2000 OK\r\n\r\n", bad},
		{"no space after the code", "HTTP/1.1 200OK\r\n\r\n", bad},
		{"tab after the code", "HTTP/1.1 200\tOK\r\n\r\n", bad},
		{"signed status", "HTTP/1.1 +99 OK\r\n\r\n", bad},
		{"no status", "HTTP/1.1\r\n\r\n", bad},
		{"http/2.0", "HTTP/2.0 200 OK\r\n\r\n", bad},
		{"http/1.2", "HTTP/1.2 200 OK\r\n\r\n", bad},
		{"lowercase version", "http/1.1 200 OK\r\n\r\n", bad},
		{"nul in reason", "HTTP/1.1 200 O\x00K\r\n\r\n", bad},
		{"bare cr in reason", "HTTP/1.1 200 O\rK\r\n\r\n", bad},
		{"leading empty line", "\r\nHTTP/1.1 200 OK\r\n\r\n", bad},
		{"obs-fold", "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", bad},
		{"whitespace before colon", "HTTP/1.1 200 OK\r\nX : a\r\n\r\n", bad},
		{"invalid content-length", "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", bad},
		{"invalid content-length with chunked", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\nTransfer-Encoding: chunked\r\n\r\n", bad},
		{"differing content-length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", bad},
		{"chunked in http/1.0", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", bad},
		{"empty transfer-encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: ,\r\n\r\n", bad},
		{"129 fields", many(129), bad},
		{"incomplete", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", responseWant{incomplete: true}},
		{"incomplete status line", "HTTP/1.1 200", responseWant{incomplete: true}},
	}
}

func TestParseResponseHead(t *testing.T) {
	var h responseHead
	for _, tc := range responseCases() {
		t.Run(tc.name, func(t *testing.T) {
			n, err := parseResponseHead([]byte(tc.in), &h, 64<<10)
			want := tc.want
			if want.status != 0 {
				var we *wireError
				if !errors.As(err, &we) || we.status != want.status || n != 0 {
					t.Fatalf("parse = %d, %v; want a wireError with status %d", n, err, want.status)
				}
				return
			}
			if want.incomplete {
				if n != 0 || err != nil {
					t.Fatalf("parse = %d, %v; want 0, nil (incomplete)", n, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if wantN := strings.Index(tc.in, "\r\n\r\n") + 4; strings.Contains(tc.in, "\r\n\r\n") && n != wantN {
				t.Errorf("n = %d, want %d", n, wantN)
			}
			got := responseWant{code: h.status, reason: string(h.reason), minor: h.minor, contentLength: h.contentLength,
				chunked: h.chunked, keepAlive: h.keepAlive}
			if got != want {
				t.Errorf("parsed %+v, want %+v", got, want)
			}
		})
	}
}

func TestParseResponseHeadMax(t *testing.T) {
	in := []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
	var h responseHead
	if n, err := parseResponseHead(in, &h, len(in)); n != len(in) || err != nil {
		t.Fatalf("head of exactly max = %d, %v", n, err)
	}
	var we *wireError
	if _, err := parseResponseHead(in, &h, len(in)-1); !errors.As(err, &we) || we.status != 502 {
		t.Fatalf("head over max = %v, want status 502", err)
	}
	if _, err := parseResponseHead(in[:20], &h, 10); !errors.As(err, &we) || we.status != 502 {
		t.Fatalf("incomplete head over max = %v, want status 502", err)
	}
}

type chunkedCase struct {
	name   string
	in     string
	n      int  // body length when it ends (0: all of in)
	done   bool // the body ends within in
	reject bool
}

func chunkedCases() []chunkedCase {
	longExtension := "1;" + strings.Repeat("x", chunkLineLimit-4) + "\r\na\r\n0\r\n\r\n" // a line of 4096 bytes with its CRLF
	manyTrailers := "0\r\n" + strings.Repeat("X-Trailer: "+strings.Repeat("t", 1000)+"\r\n", 60) + "\r\n"
	tooManyTrailers := "0\r\n" + strings.Repeat("X-Trailer: "+strings.Repeat("t", 1000)+"\r\n", 70) + "\r\n"
	return []chunkedCase{
		{name: "empty body", in: "0\r\n\r\n", done: true},
		{name: "one chunk", in: "5\r\nhello\r\n0\r\n\r\n", done: true},
		{name: "two chunks and a pipelined request", in: "5\r\nhello\r\n1\r\n!\r\n0\r\n\r\nGET / HTTP/1.1\r\n",
			n: len("5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n"), done: true},
		{name: "hex sizes", in: "a\r\n0123456789\r\nA\r\n0123456789\r\n0\r\n\r\n", done: true},
		{name: "leading zeros", in: "0005\r\nhello\r\n000\r\n\r\n", done: true},
		{name: "sixteen digits", in: "0000000000000005\r\nhello\r\n0\r\n\r\n", done: true},
		{name: "extensions", in: "5;name=value;q=\"a b\"\r\nhello\r\n0;last\r\n\r\n", done: true},
		{name: "empty extension", in: "5;\r\nhello\r\n0\r\n\r\n", done: true},
		{name: "whitespace after the size", in: "5 \t\r\nhello\r\n0\r\n\r\n", done: true},
		{name: "trailers", in: "5\r\nhello\r\n0\r\nX-Sum: abc\r\nX-Empty:\r\n\r\n", done: true},
		{name: "trailer with obs-text", in: "0\r\nX: caf\xc3\xa9\r\n\r\n", done: true},
		{name: "chunk line of 4 KiB", in: longExtension, done: true},
		{name: "trailer section under 64 KiB", in: manyTrailers, done: true},
		{name: "incomplete size", in: "5", done: false},
		{name: "incomplete data", in: "5\r\nhel", done: false},
		{name: "incomplete trailer", in: "0\r\nX: a\r\n", done: false},
		{name: "incomplete final crlf", in: "0\r\n\r", done: false},
		{name: "largest size", in: "4000000000000000\r\n", done: false},

		{name: "empty size", in: "\r\n", reject: true},
		{name: "bad hex", in: "5x\r\nhello\r\n", reject: true},
		{name: "sign", in: "+5\r\nhello\r\n", reject: true},
		{name: "space before the size", in: " 5\r\nhello\r\n", reject: true},
		{name: "space before an extension", in: "5 ;a\r\nhello\r\n", reject: true},
		{name: "seventeen digits", in: "00000000000000005\r\nhello\r\n0\r\n\r\n", reject: true},
		{name: "size over 2^62", in: "4000000000000001\r\n", reject: true},
		{name: "size over 2^64", in: "10000000000000000\r\n", reject: true},
		{name: "bare lf after the size", in: "5\nhello\r\n0\r\n\r\n", reject: true},
		{name: "bare lf after an extension", in: "5;a\nhello\r\n0\r\n\r\n", reject: true},
		{name: "bare cr in the size line", in: "5\rhello\r\n", reject: true},
		{name: "ctl in an extension", in: "5;a\x00\r\nhello\r\n0\r\n\r\n", reject: true},
		{name: "chunk line over 4 KiB", in: "1;" + strings.Repeat("x", chunkLineLimit-3) + "\r\na\r\n0\r\n\r\n", reject: true},
		{name: "data longer than its size", in: "5\r\nhello!\r\n0\r\n\r\n", reject: true},
		{name: "bare lf after data", in: "5\r\nhello\n0\r\n\r\n", reject: true},
		{name: "bare cr after data", in: "5\r\nhello\r0\r\n\r\n", reject: true},
		{name: "bare lf as the final line", in: "0\r\n\n", reject: true},
		{name: "bare cr as the final line", in: "0\r\n\rX", reject: true},
		{name: "bare lf after a trailer", in: "0\r\nX: a\n\r\n", reject: true},
		{name: "trailer obs-fold", in: "0\r\nX: a\r\n b\r\n\r\n", reject: true},
		{name: "trailer whitespace before colon", in: "0\r\nX : a\r\n\r\n", reject: true},
		{name: "trailer without colon", in: "0\r\nX\r\n\r\n", reject: true},
		{name: "trailer nul", in: "0\r\nX: a\x00\r\n\r\n", reject: true},
		{name: "trailer line over 8 KiB", in: "0\r\nX: " + strings.Repeat("v", trailerLineLimit) + "\r\n\r\n", reject: true},
		{name: "trailer section over 64 KiB", in: tooManyTrailers, reject: true},
		{name: "too much non-data", in: strings.Repeat("1;"+strings.Repeat("e", 1000)+"\r\nx\r\n", 20) + "0\r\n\r\n", reject: true},
	}
}

// scanAll feeds in to a fresh scanner in pieces of the given sizes (cycled),
// and returns the total n, done and the error.
func scanAll(s *chunkedScanner, in []byte, sizes []int) (int, bool, error) {
	s.reset()
	total := 0
	for k := 0; total < len(in); k++ {
		end := min(total+sizes[k%len(sizes)], len(in))
		n, done, err := s.scan(in[total:end])
		if n < end-total && !done && err == nil {
			return total + n, false, fmt.Errorf("scan counted %d of %d bytes without ending", n, end-total)
		}
		total += n
		if done || err != nil {
			return total, done, err
		}
	}
	return total, false, nil
}

func TestChunkedScanner(t *testing.T) {
	var s chunkedScanner
	for _, tc := range chunkedCases() {
		t.Run(tc.name, func(t *testing.T) {
			for _, sizes := range [][]int{{len(tc.in) + 1}, {1}, {2, 3}, {7}} {
				n, done, err := scanAll(&s, []byte(tc.in), sizes)
				if tc.reject {
					var we *wireError
					if !errors.As(err, &we) || we.status != 400 {
						t.Fatalf("pieces %v: scan = %d, %v, %v; want a 400 wireError", sizes, n, done, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("pieces %v: scan: %v", sizes, err)
				}
				wantN := tc.n
				if wantN == 0 {
					wantN = len(tc.in)
				}
				if n != wantN || done != tc.done {
					t.Fatalf("pieces %v: scan = %d, %v; want %d, %v", sizes, n, done, wantN, tc.done)
				}
			}
		})
	}
}

func TestChunkedScannerAfterTheEnd(t *testing.T) {
	var s chunkedScanner
	if n, done, err := s.scan([]byte("0\r\n\r\nmore")); n != 5 || !done || err != nil {
		t.Fatalf("scan = %d, %v, %v", n, done, err)
	}
	if n, done, err := s.scan([]byte("more")); n != 0 || !done || err != nil {
		t.Fatalf("scan after the end = %d, %v, %v; want 0, true, nil", n, done, err)
	}
	_, _, err := s.scan([]byte("\r\n")) // still done
	if err != nil {
		t.Fatal(err)
	}
	s.reset()
	if _, _, err := s.scan([]byte("x")); err == nil {
		t.Fatal("no error for a bad size after reset")
	}
	if n, _, err2 := s.scan([]byte("0\r\n\r\n")); n != 0 || err2 == nil {
		t.Fatalf("scan after an error = %d, %v; want the error again", n, err2)
	}
	s.reset()
	if n, done, err := s.scan([]byte("0\r\n\r\n")); n != 5 || !done || err != nil {
		t.Fatalf("scan after reset = %d, %v, %v", n, done, err)
	}
}

func TestWireZeroAllocs(t *testing.T) {
	for _, in := range []string{wrkRequest, browserRequest} {
		buf := []byte(in)
		var h requestHead
		if _, err := parseRequestHead(buf, &h, 8192); err != nil { // warm-up: grows headers and connection
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if n, err := parseRequestHead(buf, &h, 8192); n != len(buf) || err != nil {
				t.Fatalf("parse = %d, %v", n, err)
			}
		})
		if allocs != 0 {
			t.Errorf("parseRequestHead(%.20q...) allocates %v times per call, want 0", in, allocs)
		}
	}
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nServer: x\r\n\r\n")
	var rh responseHead
	if _, err := parseResponseHead(resp, &rh, 8192); err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = parseResponseHead(resp, &rh, 8192) }); allocs != 0 {
		t.Errorf("parseResponseHead allocates %v times per call, want 0", allocs)
	}
	body := []byte("5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-Sum: 1\r\n\r\n")
	var s chunkedScanner
	allocs := testing.AllocsPerRun(100, func() {
		s.reset()
		for i := range body { // byte by byte, the slowest split
			if _, _, err := s.scan(body[i : i+1]); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("chunkedScanner.scan allocates %v times per body, want 0", allocs)
	}
}

// TestParseRequestHeadMatchesNetHTTP runs the net/http comparison of
// wire_fuzz_test.go over the table inputs and over requests built at random
// from good and bad parts, then mutated.
func TestParseRequestHeadMatchesNetHTTP(t *testing.T) {
	for _, tc := range requestCases() {
		compareRequestWithNetHTTP(t, []byte(tc.in))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		compareRequestWithNetHTTP(t, mutate(r, randomRequest(r)))
		if t.Failed() {
			return
		}
	}
}

func TestParseResponseHeadMatchesNetHTTP(t *testing.T) {
	for _, tc := range responseCases() {
		compareResponseWithNetHTTP(t, []byte(tc.in))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		compareResponseWithNetHTTP(t, mutate(r, randomResponse(r)))
		if t.Failed() {
			return
		}
	}
}

func TestChunkedScannerMatchesNetHTTP(t *testing.T) {
	for _, tc := range chunkedCases() {
		compareChunkedWithNetHTTP(t, []byte(tc.in), 1)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 20000 {
		compareChunkedWithNetHTTP(t, mutate(r, randomChunkedBody(r)), uint64(i))
		if t.Failed() {
			return
		}
	}
}

func pick[T any](r *rand.Rand, choices ...T) T { return choices[r.IntN(len(choices))] }

// goodOrBad picks one of good, or one of bad about once in ten, so that most
// random messages are valid apart from a flaw or two.
func goodOrBad(r *rand.Rand, good, bad []string) string {
	if len(bad) > 0 && r.IntN(10) == 0 {
		return pick(r, bad...)
	}
	return pick(r, good...)
}

func lineEnd(r *rand.Rand) string {
	return goodOrBad(r, []string{"\r\n", "\r\n", "\n"}, []string{"\r", "\r\r\n", "\n\r"})
}

// goodFields and badFields are header fields for the random heads; good ones
// may still clash with each other (two Content-Lengths, TE with CL...).
func goodFields() []string {
	return []string{
		"Host: example.com:8080", "host: A", "Host:", "Host: [fd00::1]",
		"Content-Length: 5", "Content-Length: 0", "content-length: 05", "Content-Length:  5 ",
		"Transfer-Encoding: chunked", "Transfer-Encoding: CHUNKED",
		"Connection: close", "Connection: keep-alive", "Connection: Upgrade, Keep-Alive", "connection: x, close",
		"Upgrade: websocket", "Expect: 100-continue", "Pragma: no-cache", "Cache-Control: max-age=0",
		"X-A: b", "X-A: c", "x-a: B", "X-Tab:\tv\t", "X-Empty:", "X-Obs: caf\xc3\xa9", "A: b: c", "User-Agent: wrk",
	}
}

func badFields() []string {
	return []string{
		"Host: a b", "Host: a/b", "Content-Length: 5, 5", "Content-Length: -1", "Content-Length: 99999999999999999999",
		"Transfer-Encoding: gzip, chunked", "Transfer-Encoding: chunked, gzip", "Transfer-Encoding: identity",
		"Transfer-Encoding:", "Transfer-Encoding: chunked,", "X-Nul: a\x00b", "X-Del: \x7f", "X-Cr: a\rb",
		" X-Fold: a", "\tX-Fold: b", "X-Space : a", "X Y: a", ": empty", "NoColon", "X-\xff: a",
	}
}

func randomFields(r *rand.Rand, b *bytes.Buffer, host bool) {
	if host && r.IntN(8) != 0 {
		b.WriteString("Host: a")
		b.WriteString(lineEnd(r))
	}
	for range r.IntN(6) {
		b.WriteString(goodOrBad(r, goodFields(), badFields()))
		b.WriteString(lineEnd(r))
	}
	b.WriteString(goodOrBad(r, []string{"\r\n", "\r\n", "\n"}, []string{"", "\r"}))
}

func randomRequest(r *rand.Rand) []byte {
	var b bytes.Buffer
	for range goodOrBad(r, []string{"", "", "", "\r\n", "\n"}, []string{"\r\n\r\n\r\n\r\n\r\n", "\r"}) {
		b.WriteString(pick(r, "\r\n", "\n"))
	}
	b.WriteString(goodOrBad(r, []string{"GET", "GET", "POST", "PUT", "CONNECT", "OPTIONS", "M-X", "get"}, []string{"G@T", "", "PRI"}))
	b.WriteString(goodOrBad(r, []string{" "}, []string{"  ", "\t"}))
	b.WriteString(goodOrBad(r, []string{"/", "/a?b=c", "*", "a:443", "http://h/p", "/\xe9", "/a#f"}, []string{"/%zz", "foo", "", "/a\x01"}))
	b.WriteString(goodOrBad(r, []string{" "}, []string{"  ", ""}))
	b.WriteString(goodOrBad(r, []string{"HTTP/1.1", "HTTP/1.1", "HTTP/1.0"},
		[]string{"HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "http/1.1", "HTTP/1.10", "HTTP/1"}))
	b.WriteString(lineEnd(r))
	randomFields(r, &b, true)
	b.WriteString(pick(r, "", "body", "\r\n"))
	return b.Bytes()
}

func randomResponse(r *rand.Rand) []byte {
	var b bytes.Buffer
	b.WriteString(goodOrBad(r, []string{"HTTP/1.1", "HTTP/1.1", "HTTP/1.0"}, []string{"HTTP/2.0", "HTTP/1.5", "HTTP/1.1x"}))
	b.WriteString(goodOrBad(r, []string{" "}, []string{"  ", "\t", ""}))
	b.WriteString(goodOrBad(r, []string{"200", "200", "204", "304", "101", "100", "404", "999"}, []string{"099", "+99", "-99", "2000", "20", "abc"}))
	b.WriteString(goodOrBad(r, []string{" OK", "", " ", " Not Found", " caf\xc3\xa9"}, []string{"\tOK", "OK", " O\x01K"}))
	b.WriteString(lineEnd(r))
	randomFields(r, &b, false)
	b.WriteString(pick(r, "", "body"))
	return b.Bytes()
}

func randomChunkedBody(r *rand.Rand) []byte {
	var b bytes.Buffer
	crlf := func() string { return goodOrBad(r, []string{"\r\n"}, []string{"\n", "\r", ""}) }
	for range r.IntN(4) {
		size := r.IntN(20)
		b.WriteString(goodOrBad(r, []string{fmt.Sprintf("%x", size), fmt.Sprintf("%X", size), fmt.Sprintf("00%x", size), fmt.Sprintf("%x ", size)},
			[]string{fmt.Sprintf(" %x", size), fmt.Sprintf("+%x", size), ""}))
		b.WriteString(goodOrBad(r, []string{"", "", "", ";a=b", ";", ";q=\"x y\""}, []string{" ;a", ";\x01"}))
		b.WriteString(crlf())
		b.WriteString(strings.Repeat("d", size))
		b.WriteString(goodOrBad(r, []string{""}, []string{"d"}))
		b.WriteString(crlf())
	}
	b.WriteString(goodOrBad(r, []string{"0", "0", "000", "0;x", "0 "}, []string{""}))
	b.WriteString(crlf())
	for range pick(r, 0, 0, 0, 1, 2) {
		b.WriteString(goodOrBad(r, []string{"X-T: v", "X-T:", "X-T: caf\xc3\xa9"}, []string{"x-t : v", " X-T: v", "X-T: a\x00", "NoColon"}))
		b.WriteString(crlf())
	}
	b.WriteString(crlf())
	b.WriteString(pick(r, "", "", "GET / HTTP/1.1\r\n"))
	return b.Bytes()
}

// mutate leaves most inputs alone and changes, inserts or deletes a few bytes
// in the others.
func mutate(r *rand.Rand, in []byte) []byte {
	if r.IntN(4) != 0 || len(in) == 0 {
		return in
	}
	special := []byte{'\r', '\n', ' ', '\t', ':', ',', ';', 0, 0x7f, 0xff, '0', 'a'}
	for range 1 + r.IntN(3) {
		i := r.IntN(len(in))
		c := special[r.IntN(len(special))]
		switch r.IntN(3) {
		case 0:
			in[i] = c
		case 1:
			in = append(in[:i], append([]byte{c}, in[i:]...)...)
		default:
			if len(in) > 1 {
				in = append(in[:i], in[i+1:]...)
			}
		}
	}
	return in
}

func BenchmarkParseRequestHead(b *testing.B) {
	for _, bc := range []struct{ name, in string }{{"wrk", wrkRequest}, {"browser", browserRequest}} {
		b.Run(bc.name, func(b *testing.B) {
			buf := []byte(bc.in)
			var h requestHead
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseRequestHead(buf, &h, 8192); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
