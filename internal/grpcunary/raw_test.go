package grpcunary

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

const testPath = "/test.Echo/Call"

// testServer serves an echo method: the request upper-cased; "fail" is
// an InvalidArgument; "block" waits for release (or its context). With
// try set, Method.Try answers on the reader the requests "try:X" (TRY:X
// upper-cased; "try:fail" an InvalidArgument) and declines the others;
// tries and calls count Try's answers and Call's calls.
type testServer struct {
	*Server
	addr    string
	inline  bool
	try     bool
	release chan struct{}
	started chan struct{}

	tries, calls atomic.Int64
}

func startTest(t *testing.T, inline bool, opts Options) *testServer {
	t.Helper()
	ts := &testServer{inline: inline, release: make(chan struct{}), started: make(chan struct{}, 64)}
	m := Method{Path: testPath, Inline: func() bool { return ts.inline }, Call: func(ctx context.Context, req, dst []byte) ([]byte, codes.Code, string) {
		ts.calls.Add(1)
		switch string(req) {
		case "fail":
			return dst, codes.InvalidArgument, "failed: 100%"
		case "hold": // a call that does not heed its context
			ts.started <- struct{}{}
			<-ts.release
		case "block":
			ts.started <- struct{}{}
			select {
			case <-ts.release:
			case <-ctx.Done():
				return dst, codes.Unavailable, ctx.Err().Error()
			}
		}
		return append(dst, bytes.ToUpper(req)...), codes.OK, ""
	}, Try: func(req, dst []byte) ([]byte, codes.Code, string, bool) {
		if !ts.try || !bytes.HasPrefix(req, []byte("try:")) {
			return append(dst, "garbage"...), codes.OK, "", false
		}
		ts.tries.Add(1)
		if string(req) == "try:fail" {
			return dst, codes.InvalidArgument, "tried: 100%", true
		}
		return append(dst, bytes.ToUpper(req)...), codes.OK, "", true
	}}
	ts.Server = NewServer(m, opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = ln.Addr().String()
	go func() { _ = ts.Serve(ln) }()
	t.Cleanup(ts.Stop)
	return ts
}

// rawConn is a hand-driven HTTP/2 client.
type rawConn struct {
	t   *testing.T
	c   net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

// dialRaw connects, sends the preface and SETTINGS (extra settings
// included) and reads the server's SETTINGS.
func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	rc := &rawConn{t: t, c: c, fr: http2.NewFramer(c, c)}
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rc.enc = hpack.NewEncoder(&rc.hb)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	f := rc.next()
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		t.Fatalf("first frame %v, want the server's SETTINGS", f)
	}
	return rc
}

func (rc *rawConn) next() http2.Frame {
	rc.t.Helper()
	f, err := rc.fr.ReadFrame()
	if err != nil {
		rc.t.Fatalf("read frame: %v", err)
	}
	return f
}

func (rc *rawConn) block(fields ...string) []byte {
	rc.hb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = rc.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(rc.hb.Bytes())
}

// request is a valid request's header fields, then extra ones.
func request(extra ...string) []string {
	return append([]string{":method", "POST", ":scheme", "http", ":path", testPath, ":authority", "x",
		"content-type", "application/grpc", "te", "trailers"}, extra...)
}

func (rc *rawConn) headers(id uint32, end bool, fields ...string) {
	rc.t.Helper()
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.block(fields...), EndStream: end, EndHeaders: true}); err != nil {
		rc.t.Fatal(err)
	}
}

func msg(flag byte, b string) []byte {
	out := []byte{flag, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

// call sends a whole request on id.
func (rc *rawConn) call(id uint32, body []byte, extra ...string) {
	rc.t.Helper()
	rc.headers(id, false, request(extra...)...)
	if err := rc.fr.WriteData(id, true, body); err != nil {
		rc.t.Fatal(err)
	}
}

// answer is what came back on one stream.
type answer struct {
	status, grpcStatus, grpcMessage string
	data                            []byte
	rst                             http2.ErrCode
	hasRST                          bool
}

// until reads frames until stop says so (window updates, pings and
// settings are skipped); it returns the answers by stream and the
// GOAWAY seen, if any.
func (rc *rawConn) until(stop func(map[uint32]*answer, *http2.GoAwayFrame) bool) (map[uint32]*answer, *http2.GoAwayFrame) {
	rc.t.Helper()
	ans := map[uint32]*answer{}
	var ga *http2.GoAwayFrame
	get := func(id uint32) *answer {
		if ans[id] == nil {
			ans[id] = &answer{}
		}
		return ans[id]
	}
	for !stop(ans, ga) {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			dbg := ""
			if ga != nil {
				dbg = string(ga.DebugData())
			}
			rc.t.Fatalf("read frame: %v (answers %v, goaway %v %q)", err, ans, ga, dbg)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			a := get(f.StreamID)
			for _, hf := range f.Fields {
				switch hf.Name {
				case ":status":
					a.status = hf.Value
				case "grpc-status":
					a.grpcStatus = hf.Value
				case "grpc-message":
					a.grpcMessage = hf.Value
				}
			}
		case *http2.DataFrame:
			get(f.StreamID).data = append(get(f.StreamID).data, f.Data()...)
		case *http2.RSTStreamFrame:
			a := get(f.StreamID)
			a.rst, a.hasRST = f.ErrCode, true
		case *http2.GoAwayFrame:
			g := *f
			ga = &g
		}
	}
	return ans, ga
}

func done(id uint32) func(map[uint32]*answer, *http2.GoAwayFrame) bool {
	return func(a map[uint32]*answer, _ *http2.GoAwayFrame) bool {
		return a[id] != nil && (a[id].grpcStatus != "" || a[id].hasRST)
	}
}

func goneAway(_ map[uint32]*answer, ga *http2.GoAwayFrame) bool { return ga != nil }

// expectClosed: the connection ends (EOF or reset) within d.
func (rc *rawConn) expectClosed(d time.Duration) {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	for {
		if _, err := rc.fr.ReadFrame(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				rc.t.Fatalf("the connection is still open after %v", d)
			}
			return
		}
	}
}

// TestRawCalls: answers, statuses and refusals of single streams, and
// the connection goes on serving after each.
func TestRawCalls(t *testing.T) {
	for _, mode := range []struct{ inline, try bool }{{true, false}, {false, false}, {false, true}} {
		inline := mode.inline
		t.Run(fmt.Sprintf("inline=%v try=%v", inline, mode.try), func(t *testing.T) {
			ts := startTest(t, inline, Options{MaxRecvMsgSize: 1000})
			ts.try = mode.try // Try declines every call below: they run on workers
			rc := dialRaw(t, ts.addr)
			id := uint32(1)
			type want struct{ status, grpc, msgHas, data string }
			for _, tc := range []struct {
				name  string
				send  func(id uint32)
				want  want
				rstNo bool
			}{
				{"echo", func(id uint32) { rc.call(id, msg(0, "hello")) }, want{"200", "0", "", string(msg(0, "HELLO"))}, false},
				{"an error status, percent-encoded", func(id uint32) { rc.call(id, msg(0, "fail")) }, want{"200", "3", "failed: 100%25", ""}, false},
				{"another method", func(id uint32) {
					rc.headers(id, true, ":method", "POST", ":scheme", "http", ":path", "/test.Echo/Other", ":authority", "x", "content-type", "application/grpc")
				}, want{"200", "12", "unknown method Other for service test.Echo", ""}, false},
				{"another method, body following", func(id uint32) {
					rc.headers(id, false, ":method", "POST", ":scheme", "http", ":path", "/other.S/M", ":authority", "x", "content-type", "application/grpc")
				}, want{"200", "12", "unknown method M for service other.S", ""}, true},
				{"not a gRPC content-type", func(id uint32) {
					rc.headers(id, true, ":method", "POST", ":scheme", "http", ":path", testPath, ":authority", "x", "content-type", "application/json")
				}, want{"415", "3", "content-type", ""}, false},
				{"GET", func(id uint32) {
					rc.headers(id, true, ":method", "GET", ":scheme", "http", ":path", testPath, ":authority", "x", "content-type", "application/grpc")
				}, want{"405", "13", "POST", ""}, false},
				{"compressed, identity", func(id uint32) { rc.call(id, msg(1, "x")) }, want{"200", "13", "compressed flag", ""}, false},
				{"compressed, gzip", func(id uint32) { rc.call(id, msg(1, "x"), "grpc-encoding", "gzip") }, want{"200", "12", "gzip", ""}, false},
				{"a bad compressed-flag", func(id uint32) { rc.call(id, msg(7, "x")) }, want{"200", "13", "compressed-flag", ""}, false},
				{"no message", func(id uint32) { rc.headers(id, true, request()...) }, want{"200", "13", "no whole message", ""}, false},
				{"a truncated message", func(id uint32) { rc.call(id, msg(0, "hello")[:7]) }, want{"200", "13", "one whole message", ""}, false},
				{"two messages", func(id uint32) { rc.call(id, append(msg(0, "a"), msg(0, "b")...)) }, want{"200", "13", "one whole message", ""}, false},
				{"a message over MaxRecvMsgSize", func(id uint32) { rc.call(id, msg(0, strings.Repeat("x", 1001))) }, want{"200", "8", "larger than max (1001 vs. 1000)", ""}, false},
				{"a message announced over MaxRecvMsgSize, the rest not sent", func(id uint32) {
					rc.headers(id, false, request()...)
					_ = rc.fr.WriteData(id, false, []byte{0, 0, 0x10, 0, 0})
				}, want{"200", "8", "larger than max", ""}, true},
				{"a message at MaxRecvMsgSize, in frames", func(id uint32) {
					rc.headers(id, false, request()...)
					b := msg(0, strings.Repeat("y", 1000))
					_ = rc.fr.WriteData(id, false, b[:3])
					_ = rc.fr.WriteData(id, false, b[3:500])
					_ = rc.fr.WriteDataPadded(id, true, b[500:], make([]byte, 100))
				}, want{"200", "0", "", string(msg(0, strings.Repeat("Y", 1000)))}, false},
				{"an expired grpc-timeout", func(id uint32) { rc.call(id, msg(0, "x"), "grpc-timeout", "0n") }, want{"200", "4", "deadline", ""}, false},
				{"a malformed grpc-timeout", func(id uint32) { rc.call(id, msg(0, "x"), "grpc-timeout", "123456789S") }, want{"400", "13", "grpc-timeout", ""}, false},
				{"echo after all that", func(id uint32) { rc.call(id, msg(0, "again"), "grpc-timeout", "10S") }, want{"200", "0", "", string(msg(0, "AGAIN"))}, false},
			} {
				tc.send(id)
				ans, ga := rc.until(func(a map[uint32]*answer, ga *http2.GoAwayFrame) bool {
					return ga != nil || done(id)(a, ga) && (!tc.rstNo || a[id].hasRST)
				})
				a := ans[id]
				if ga != nil || a == nil {
					t.Fatalf("%s: GOAWAY %v, answer %v", tc.name, ga, a)
				}
				if a.status != tc.want.status || a.grpcStatus != tc.want.grpc || !strings.Contains(a.grpcMessage, tc.want.msgHas) || string(a.data) != tc.want.data {
					t.Errorf("%s: :status %s grpc-status %s %q data %q, want %v", tc.name, a.status, a.grpcStatus, a.grpcMessage, a.data, tc.want)
				}
				if tc.rstNo && (!a.hasRST || a.rst != http2.ErrCodeNo) {
					t.Errorf("%s: RST_STREAM %v %v, want NO_ERROR (the rest of the request is not needed)", tc.name, a.hasRST, a.rst)
				}
				id += 2
			}
		})
	}
}

// TestConnectionErrors: what breaks HTTP/2 itself ends the connection
// with a GOAWAY carrying the error.
func TestConnectionErrors(t *testing.T) {
	ts := startTest(t, true, Options{})
	for _, tc := range []struct {
		name string
		send func(rc *rawConn)
		code http2.ErrCode
	}{
		{"an even stream id", func(rc *rawConn) { rc.headers(2, true, request()...) }, http2.ErrCodeProtocol},
		{"a decreasing stream id", func(rc *rawConn) {
			rc.call(5, msg(0, "a"))
			rc.until(done(5))
			rc.headers(3, true, request()...)
		}, http2.ErrCodeProtocol},
		{"a stream id reused", func(rc *rawConn) {
			rc.call(1, msg(0, "a"))
			rc.until(done(1))
			rc.headers(1, true, request()...)
		}, http2.ErrCodeProtocol},
		{"DATA on an idle stream", func(rc *rawConn) { _ = rc.fr.WriteData(99, true, msg(0, "a")) }, http2.ErrCodeProtocol},
		{"WINDOW_UPDATE on an idle stream", func(rc *rawConn) { _ = rc.fr.WriteWindowUpdate(7, 1) }, http2.ErrCodeProtocol},
		{"RST_STREAM on an idle stream", func(rc *rawConn) { _ = rc.fr.WriteRSTStream(7, http2.ErrCodeCancel) }, http2.ErrCodeProtocol},
		{"PUSH_PROMISE", func(rc *rawConn) {
			_ = rc.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: rc.block(request()...), EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"a frame over SETTINGS_MAX_FRAME_SIZE", func(rc *rawConn) {
			rc.headers(1, false, request()...)
			_ = rc.fr.WriteData(1, true, make([]byte, 16385))
		}, http2.ErrCodeFrameSize},
		{"the connection window overflowed", func(rc *rawConn) { _ = rc.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
		{"DATA beyond the connection's window", func(rc *rawConn) {
			// 1 MiB announced; streams of 256 KiB each, never ended.
			chunk := make([]byte, 16384)
			for id := uint32(1); id <= 11; id += 2 {
				rc.headers(id, false, request()...)
				for range 16 {
					if rc.fr.WriteData(id, false, chunk) != nil {
						return
					}
				}
			}
		}, http2.ErrCodeFlowControl},
		{"a CONTINUATION flood", func(rc *rawConn) {
			_ = rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.block(request()...)})
			big := rc.block("x-pad", strings.Repeat("p", 8000))
			for range 100 {
				if rc.fr.WriteContinuation(1, false, big) != nil {
					return
				}
			}
		}, http2.ErrCodeProtocol},
		{"SETTINGS_ENABLE_PUSH 2", func(rc *rawConn) { _ = rc.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 2}) }, http2.ErrCodeProtocol},
		{"SETTINGS_MAX_FRAME_SIZE below 16384", func(rc *rawConn) {
			_ = rc.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 100})
		}, http2.ErrCodeProtocol},
		{"HPACK garbage", func(rc *rawConn) {
			_ = rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}, http2.ErrCodeCompression},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, ts.addr)
			tc.send(rc)
			_, ga := rc.until(goneAway)
			if ga.ErrCode != tc.code {
				t.Errorf("GOAWAY %v (%q), want %v", ga.ErrCode, ga.DebugData(), tc.code)
			}
			rc.expectClosed(5 * time.Second)
		})
	}
}

// TestStreamErrors: errors of one stream reset it; the connection serves on.
func TestStreamErrors(t *testing.T) {
	ts := startTest(t, true, Options{MaxHeaderListSize: 4096})
	rc := dialRaw(t, ts.addr)
	// Request trailers (HEADERS again before END_STREAM).
	rc.headers(1, false, request()...)
	rc.headers(1, true, "x-trailer", "1")
	if a, _ := rc.until(done(1)); a[1].rst != http2.ErrCodeProtocol {
		t.Errorf("request trailers: %+v, want RST_STREAM PROTOCOL_ERROR", a[1])
	}
	// DATA on a stream whose request was whole (and answered).
	rc.call(3, msg(0, "a"))
	rc.until(done(3))
	_ = rc.fr.WriteData(3, true, msg(0, "b"))
	if a, _ := rc.until(done(3)); !a[3].hasRST || a[3].rst != http2.ErrCodeStreamClosed {
		t.Errorf("DATA on a closed stream: %+v, want RST_STREAM STREAM_CLOSED", a[3])
	}
	// A header list over the bound: the stream is refused, the
	// connection (and its HPACK state) goes on.
	big := strings.Repeat("b", 2000)
	rc.call(5, msg(0, "a"), "x-big1", big, "x-big2", big, "x-big3", big)
	if a, _ := rc.until(done(5)); a[5].grpcStatus != "8" || a[5].status != "431" {
		t.Errorf("header list over 4096 bytes: %+v, want 431 with RESOURCE_EXHAUSTED", a[5])
	}
	// An invalid header field name.
	rc.headers(7, true, append(request(), "Upper", "x")...)
	if a, _ := rc.until(done(7)); a[7].rst != http2.ErrCodeProtocol {
		t.Errorf("an invalid field name: %+v, want RST_STREAM PROTOCOL_ERROR", a[7])
	}
	// DATA that disagrees with content-length (RFC 9113 §8.1.1).
	rc.call(9, msg(0, "abc"), "content-length", "9")
	if a, _ := rc.until(done(9)); a[9].rst != http2.ErrCodeProtocol {
		t.Errorf("content-length 9 with 8 bytes: %+v, want RST_STREAM PROTOCOL_ERROR", a[9])
	}
	rc.call(11, msg(0, "abc"), "content-length", "8")
	if a, _ := rc.until(done(11)); a[11].grpcStatus != "0" {
		t.Errorf("content-length 8 with 8 bytes: %+v, want an answer", a[11])
	}
	// A stream that depends on itself (RFC 9113 §5.3.1).
	_ = rc.fr.WritePriority(13, http2.PriorityParam{StreamDep: 13})
	if a, _ := rc.until(done(13)); a[13].rst != http2.ErrCodeProtocol {
		t.Errorf("PRIORITY on itself: %+v, want RST_STREAM PROTOCOL_ERROR", a[13])
	}
	// No :scheme.
	rc.headers(15, true, ":method", "POST", ":path", testPath, "content-type", "application/grpc")
	if a, _ := rc.until(done(15)); a[15].rst != http2.ErrCodeProtocol {
		t.Errorf("no :scheme: %+v, want RST_STREAM PROTOCOL_ERROR", a[15])
	}
	rc.call(17, msg(0, "ok"))
	if a, _ := rc.until(done(17)); a[17].grpcStatus != "0" || string(a[17].data) != string(msg(0, "OK")) {
		t.Errorf("after the stream errors: %+v, want an answer", a[17])
	}
}

// TestRapidReset: streams opened and reset at once (CVE-2023-44487) cost
// the connection its abuse budget: GOAWAY ENHANCE_YOUR_CALM.
func TestRapidReset(t *testing.T) {
	ts := startTest(t, true, Options{})
	rc := dialRaw(t, ts.addr)
	block := rc.block(request()...)
	go func() {
		for id := uint32(1); id < 2*(abuseBudget+200); id += 2 {
			// The block again: the fields are indexed by the first one.
			if rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil ||
				rc.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				return
			}
			block = rc.block(request()...)
		}
	}()
	_, ga := rc.until(goneAway)
	if ga.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", ga.ErrCode)
	}
	if ga.LastStreamID > 2*(abuseBudget+200) {
		t.Errorf("GOAWAY last stream %d", ga.LastStreamID)
	}
	t.Logf("GOAWAY %v after stream %d (%q)", ga.ErrCode, ga.LastStreamID, ga.DebugData())
	rc.expectClosed(5 * time.Second)
}

// TestResetStreamsCountUntilTheirCallReturns: a reset stream whose call
// still runs keeps its place among MaxConcurrentStreams: a reset does not
// make room for more work.
func TestResetStreamsCountUntilTheirCallReturns(t *testing.T) {
	ts := startTest(t, false, Options{MaxConcurrentStreams: 4})
	defer close(ts.release)
	rc := dialRaw(t, ts.addr)
	for id := uint32(1); id <= 7; id += 2 {
		rc.call(id, msg(0, "hold"))
		<-ts.started
		_ = rc.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	rc.call(9, msg(0, "x"))
	if a, _ := rc.until(done(9)); a[9].rst != http2.ErrCodeRefusedStream {
		t.Errorf("a fifth stream while 4 reset calls run: %+v, want REFUSED_STREAM", a[9])
	}
}

// TestMaxConcurrentStreams: the stream past the bound is refused; once a
// call returns, there is room again.
func TestMaxConcurrentStreams(t *testing.T) {
	ts := startTest(t, false, Options{MaxConcurrentStreams: 3})
	rc := dialRaw(t, ts.addr)
	for id := uint32(1); id <= 5; id += 2 {
		rc.call(id, msg(0, "block"))
		<-ts.started
	}
	rc.call(7, msg(0, "x"))
	if a, _ := rc.until(done(7)); a[7].rst != http2.ErrCodeRefusedStream {
		t.Fatalf("a fourth stream: %+v, want REFUSED_STREAM", a[7])
	}
	ts.release <- struct{}{}
	rc.until(func(a map[uint32]*answer, _ *http2.GoAwayFrame) bool {
		return a[1] != nil && a[1].grpcStatus != "" || a[3] != nil && a[3].grpcStatus != "" || a[5] != nil && a[5].grpcStatus != ""
	})
	rc.call(9, msg(0, "x"))
	if a, _ := rc.until(done(9)); a[9].grpcStatus != "0" {
		t.Errorf("after one call returned: %+v, want an answer", a[9])
	}
	close(ts.release)
}

// TestPingFlood: pings more often than every 10s with no response in
// between: the third strike is GOAWAY ENHANCE_YOUR_CALM too_many_pings;
// pings between responses are fine.
func TestPingFlood(t *testing.T) {
	ts := startTest(t, true, Options{})
	rc := dialRaw(t, ts.addr)
	for i := range 5 {
		_ = rc.fr.WritePing(false, [8]byte{byte(i)})
		id := uint32(2*i + 1)
		rc.call(id, msg(0, "a"))
		rc.until(done(id))
	}
	for i := range 10 {
		if rc.fr.WritePing(false, [8]byte{byte(i)}) != nil {
			break
		}
	}
	_, ga := rc.until(goneAway)
	if ga.ErrCode != http2.ErrCodeEnhanceYourCalm || string(ga.DebugData()) != "too_many_pings" {
		t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", ga.ErrCode, ga.DebugData())
	}
	rc.expectClosed(5 * time.Second)
}

// TestFlowControl: a response waits for the client's window and goes when
// it opens; a window that never opens disconnects the client after
// WriteTimeout.
func TestFlowControl(t *testing.T) {
	ts := startTest(t, true, Options{WriteTimeout: 300 * time.Millisecond})
	rc := dialRaw(t, ts.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3})
	rc.call(1, msg(0, "hello"))
	a, _ := rc.until(func(a map[uint32]*answer, _ *http2.GoAwayFrame) bool { return a[1] != nil && len(a[1].data) == 3 })
	if a[1].status != "200" || a[1].grpcStatus != "" {
		t.Fatalf("with a 3-byte window: %+v, want HEADERS and 3 bytes", a[1])
	}
	_ = rc.fr.WriteWindowUpdate(1, 100)
	if a, _ := rc.until(done(1)); string(a[1].data) != string(msg(0, "HELLO")[3:]) || a[1].grpcStatus != "0" {
		t.Fatalf("after WINDOW_UPDATE: %+v", a[1])
	}
	// SETTINGS_INITIAL_WINDOW_SIZE raised: a waiting response goes.
	rc.call(3, msg(0, "world"))
	rc.until(func(a map[uint32]*answer, _ *http2.GoAwayFrame) bool { return a[3] != nil && len(a[3].data) == 3 })
	_ = rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000})
	if a, _ := rc.until(done(3)); a[3].grpcStatus != "0" {
		t.Fatalf("after SETTINGS raised the window: %+v", a[3])
	}
	// A window that never opens.
	_ = rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	start := time.Now()
	rc.call(5, msg(0, "stuck"))
	_, ga := rc.until(goneAway)
	if ga.ErrCode != http2.ErrCodeProtocol {
		t.Errorf("a window that never opens: GOAWAY %v, want PROTOCOL_ERROR", ga.ErrCode)
	}
	rc.expectClosed(5 * time.Second)
	t.Logf("a client whose window never opened was disconnected after %v (WriteTimeout 300ms)", time.Since(start).Round(time.Millisecond))
}

// TestTimeouts: a half-written frame then silence, a request body never
// finished, an idle connection, a connection that never sends its
// preface.
func TestTimeouts(t *testing.T) {
	o := Options{FrameTimeout: 200 * time.Millisecond, IdleTimeout: 400 * time.Millisecond, HandshakeTimeout: 200 * time.Millisecond}
	ts := startTest(t, true, o)
	t.Run("half a frame", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		_, _ = rc.c.Write([]byte{0, 0, 8, byte(http2.FramePing), 0, 0})
		_, ga := rc.until(goneAway)
		if ga.ErrCode != http2.ErrCodeProtocol {
			t.Errorf("GOAWAY %v, want PROTOCOL_ERROR (stalled)", ga.ErrCode)
		}
		rc.expectClosed(5 * time.Second)
	})
	t.Run("a body never finished", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.headers(1, false, request()...)
		_, ga := rc.until(goneAway)
		if ga.ErrCode != http2.ErrCodeProtocol {
			t.Errorf("GOAWAY %v, want PROTOCOL_ERROR (stalled)", ga.ErrCode)
		}
	})
	t.Run("idle", func(t *testing.T) {
		rc := dialRaw(t, ts.addr)
		rc.call(1, msg(0, "a"))
		rc.until(done(1))
		start := time.Now()
		_, ga := rc.until(goneAway)
		if ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
			t.Errorf("GOAWAY %v last %d, want NO_ERROR last 1", ga.ErrCode, ga.LastStreamID)
		}
		rc.expectClosed(5 * time.Second)
		t.Logf("idle connection closed after %v (IdleTimeout 400ms)", time.Since(start).Round(time.Millisecond))
	})
	for _, pre := range []string{"", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"} {
		t.Run(fmt.Sprintf("preface %q", pre), func(t *testing.T) {
			c, err := net.Dial("tcp", ts.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = c.Write([]byte(pre))
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 4096)
			for {
				n, err := c.Read(b)
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatal("still open after 5s")
					}
					break
				}
				if pre != "" && pre != http2.ClientPreface[:len(pre)] && n > 0 && b[3] != byte(http2.FrameSettings) {
					t.Fatalf("answered %q to a wrong preface", b[:n])
				}
			}
		})
	}
}

// TestGracefulStop: streams in flight finish after the GOAWAY; a stream
// opened after it is ignored; the connection then closes.
func TestGracefulStop(t *testing.T) {
	ts := startTest(t, false, Options{})
	rc := dialRaw(t, ts.addr)
	rc.call(1, msg(0, "block"))
	<-ts.started
	stopped := make(chan struct{})
	go func() {
		ts.GracefulStop(context.Background())
		close(stopped)
	}()
	_, ga := rc.until(goneAway)
	if ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
		t.Fatalf("GOAWAY %v last %d, want NO_ERROR last 1", ga.ErrCode, ga.LastStreamID)
	}
	rc.call(3, msg(0, "late"))
	close(ts.release)
	a, _ := rc.until(done(1))
	if a[1].grpcStatus != "0" || string(a[1].data) != string(msg(0, "BLOCK")) {
		t.Errorf("the stream in flight: %+v, want its answer", a[1])
	}
	if a[3] != nil {
		t.Errorf("a stream after GOAWAY was answered: %+v", a[3])
	}
	rc.expectClosed(5 * time.Second)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop did not return")
	}
}

// TestDeadline: grpc-timeout is the worker call's context deadline; the
// call's answer is sent as it is.
func TestDeadline(t *testing.T) {
	ts := startTest(t, false, Options{})
	rc := dialRaw(t, ts.addr)
	rc.call(1, msg(0, "block"), "grpc-timeout", "50m")
	if a, _ := rc.until(done(1)); a[1].grpcStatus != fmt.Sprint(int(codes.Unavailable)) || a[1].grpcMessage != "context deadline exceeded" {
		t.Errorf("a call past its grpc-timeout: %+v, want the call's own answer to its context's end", a[1])
	}
}

// FuzzFrames: any bytes after the preface are answered or end the
// connection; the server never panics or hangs.
func FuzzFrames(f *testing.F) {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := request()
	for i := 0; i < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	_ = fr.WriteSettings()
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, true, msg(0, "seed"))
	f.Add(bytes.Clone(b.Bytes()))
	_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
	_ = fr.WritePing(false, [8]byte{})
	_ = fr.WriteWindowUpdate(0, 5)
	f.Add(bytes.Clone(b.Bytes()))
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	s := NewServer(Method{Path: testPath, Call: func(_ context.Context, req, dst []byte) ([]byte, codes.Code, string) {
		return append(dst, req...), codes.OK, ""
	}}, Options{FrameTimeout: 100 * time.Millisecond, IdleTimeout: 100 * time.Millisecond, HandshakeTimeout: 100 * time.Millisecond})
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		c := newConn(s, server)
		s.wg.Add(1)
		finished := make(chan struct{})
		go func() { c.serve(); close(finished) }()
		go func() {
			_, _ = client.Write([]byte(http2.ClientPreface))
			_, _ = client.Write(in)
			// Read by the server (net.Pipe is unbuffered): the end.
			_ = client.Close()
		}()
		go func() { _, _ = bytes.NewBuffer(nil).ReadFrom(client) }()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection neither answered nor ended")
		}
	})
}

// TestTry: Method.Try answers on the reader the calls it can while a call
// it declined runs on a worker; a declined call leaves nothing of Try's in
// the connection's output; Try's errors and its answers larger than the
// client's window go as Call's do.
func TestTry(t *testing.T) {
	ts := startTest(t, false, Options{WriteTimeout: 2 * time.Second})
	ts.try = true
	rc := dialRaw(t, ts.addr)
	rc.call(1, msg(0, "block")) // declined: a worker holds it
	<-ts.started
	rc.call(3, msg(0, "try:hello"))
	if a, _ := rc.until(done(3)); a[3].grpcStatus != "0" || string(a[3].data) != string(msg(0, "TRY:HELLO")) {
		t.Fatalf("a call Try answers, while a declined one waits on a worker: %+v", a[3])
	}
	rc.call(5, msg(0, "try:fail"))
	if a, _ := rc.until(done(5)); a[5].grpcStatus != "3" || a[5].grpcMessage != "tried: 100%25" || len(a[5].data) != 0 {
		t.Fatalf("Try's error status: %+v", a[5])
	}
	close(ts.release)
	if a, _ := rc.until(done(1)); a[1].grpcStatus != "0" || string(a[1].data) != string(msg(0, "BLOCK")) {
		t.Fatalf("the declined call, answered by Call on its worker: %+v", a[1])
	}
	if tries, calls := ts.tries.Load(), ts.calls.Load(); tries != 2 || calls != 1 {
		t.Fatalf("Try answered %d and Call ran %d times, want 2 and 1", tries, calls)
	}

	// An answer larger than the client's window waits for it.
	rc2 := dialRaw(t, ts.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3})
	rc2.call(1, msg(0, "try:window"))
	rc2.until(func(a map[uint32]*answer, _ *http2.GoAwayFrame) bool { return a[1] != nil && len(a[1].data) == 3 })
	_ = rc2.fr.WriteWindowUpdate(1, 100)
	if a, _ := rc2.until(done(1)); a[1].grpcStatus != "0" || string(a[1].data) != string(msg(0, "TRY:WINDOW")[3:]) {
		t.Fatalf("Try's answer over the window, after WINDOW_UPDATE: %+v", a[1])
	}
}
