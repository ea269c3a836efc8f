package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/edgeguard/edgeguard/bench/rlsbench/rlsvt"
)

// h2conn is the load client's HTTP/2 connection: a minimal gRPC client that
// keeps depth requests in flight without a goroutine, a channel or an
// allocation per request (but the decoded message's). Every request is a
// pre-encoded HEADERS block and a pre-encoded DATA frame (the gRPC message
// as Envoy's types marshal it, built once per key). One goroutine per
// connection reads frames through a large buffer: it reads every response
// whole (headers, the message, the trailers), checks :status and
// grpc-status, decodes the message into Envoy's type (rlsvt), counts its
// overall_code and latency, and frees its slot; when its buffer is empty,
// before it blocks in read, it fills every free slot and sends the batch
// (many HEADERS+DATA pairs, with any SETTINGS ack, PING ack or
// WINDOW_UPDATE due) in one Write.
//
// HTTP/2 as a real client: stream ids odd and increasing; the connection's
// send window and the server's initial stream window and
// SETTINGS_MAX_CONCURRENT_STREAMS honoured; SETTINGS acked, PING answered;
// push disabled (a PUSH_PROMISE is a connection error, as is a frame over
// the default 16 KiB we announce);
// received DATA returned to the server by WINDOW_UPDATE, and a server that
// sends past our window is a connection error. It is used identically for
// every peer.
type h2conn struct {
	c     net.Conn
	block []byte   // the request's header block (no dynamic table)
	reqs  [][]byte // per key: the gRPC message in its 5-byte envelope
	depth int      // requests kept in flight
	drain time.Duration

	mu           sync.Mutex
	slots        []slot // by (stream id >> 1) & mask
	mask         uint32
	nextID       uint32
	inflight     int
	sendWindow   int64  // connection-level, for our DATA
	streamWindow int64  // the server's SETTINGS_INITIAL_WINDOW_SIZE
	maxStreams   uint32 // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	out          []byte // frames encoded and not yet written
	fw           *http2.Framer
	err          error // the connection failed

	// the phase running (nil between phases)
	st   *phaseStats
	end  time.Time
	rng  *rand.Rand
	done chan struct{} // closed when the phase's last answer is in

	settled chan struct{} // closed once the server's first SETTINGS is applied

	// the reader's
	br       *bufio.Reader
	fr       *http2.Framer
	dec      *hpack.Decoder
	cur      *slot // the stream whose header block is being decoded
	discard  slot  // header blocks of streams we do not know still feed HPACK
	hdrEnd   bool  // the HEADERS being continued ends its stream
	recvLeft int64 // what the server may still send on the connection
	unacked  int64 // received and not yet returned by WINDOW_UPDATE
	res      rlsv3.RateLimitResponse
	now      int64 // when the last read returned (ns since the epoch)
}

// slot is one stream in flight (under mu).
type slot struct {
	id    uint32
	start int64 // ns since the client's epoch, when its batch was written
	busy  bool

	blocks   int    // header blocks received
	status   bool   // :status 200
	sawGRPC  bool   // grpc-status received
	grpcOK   bool   // grpc-status 0
	grpcCode string // a grpc-status other than 0 (error path only)
	data     []byte
}

// phaseStats are one phase's counts on one connection.
type phaseStats struct {
	ok, over, errors int64
	record           bool
	lat              []time.Duration
	firstErr         error
}

// The connection's receive windows: large, so responses never wait for our
// WINDOW_UPDATE; returned in steps of windowStep.
const (
	recvWindow = 1 << 30
	windowStep = 1 << 20
)

var epoch = time.Now()

func nowNS() int64 { return int64(time.Since(epoch)) }

func dialH2(target string, reqs [][]byte, depth int) (*h2conn, error) {
	c, err := net.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	n := 1
	for n < 4*depth {
		n <<= 1
	}
	h := &h2conn{c: c, reqs: reqs, depth: depth, drain: defaultDrain, settled: make(chan struct{}),
		slots: make([]slot, n), mask: uint32(n - 1), nextID: 1,
		sendWindow: 65535, streamWindow: 65535, maxStreams: ^uint32(0), recvLeft: recvWindow,
		br: bufio.NewReaderSize(c, 256<<10)}
	h.fr = http2.NewFramer(nil, h.br)
	h.fr.SetReuseFrames()
	h.fr.SetMaxReadFrameSize(16384) // SETTINGS_MAX_FRAME_SIZE: we announce the default
	h.dec = hpack.NewDecoder(4096, h.emit)
	h.fw = http2.NewFramer((*appendWriter)(&h.out), nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.SetMaxDynamicTableSizeLimit(0) // every block the same bytes
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"},
		{":path", "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit"}, {":authority", target},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			c.Close()
			return nil, err
		}
	}
	h.block = hb.Bytes()
	// The preface, our SETTINGS (a large stream window) and the
	// connection's window raised to match.
	out := append([]byte(nil), http2.ClientPreface...)
	fw := http2.NewFramer((*appendWriter)(&out), nil)
	if err := fw.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow}); err != nil {
		c.Close()
		return nil, err
	}
	if err := fw.WriteWindowUpdate(0, recvWindow-65535); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := c.Write(out); err != nil {
		c.Close()
		return nil, err
	}
	go h.read()
	// The server's SETTINGS (its stream limit and windows) before the
	// first request, as grpc-go's client waits for the server preface.
	select {
	case <-h.settled:
	case <-time.After(defaultDrain):
		h.Close()
		return nil, fmt.Errorf("%s: no SETTINGS from the server within %s", target, defaultDrain)
	}
	h.mu.Lock()
	err = h.err
	h.mu.Unlock()
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// appendFrame appends one frame (RFC 9113 §4.1: 24-bit length, type,
// flags, 31-bit stream id, payload): the requests' HEADERS and DATA, whose
// payloads (at most a few hundred bytes, under any SETTINGS_MAX_FRAME_SIZE)
// are built once; http2.Framer encodes the rest. TestAppendFrame holds it
// equal to the Framer's bytes.
func appendFrame(b []byte, t http2.FrameType, flags http2.Flags, id uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), byte(t), byte(flags))
	b = binary.BigEndian.AppendUint32(b, id&(1<<31-1))
	return append(b, payload...)
}

// appendWriter lets an http2.Framer encode into a byte slice.
type appendWriter []byte

func (w *appendWriter) Write(p []byte) (int, error) { *w = append(*w, p...); return len(p), nil }

// grpcFrame is a gRPC message (uncompressed) in its 5-byte envelope.
func grpcFrame(m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...), nil
}

// defaultDrain is how long run waits, after its end, for the requests
// still in flight: a server that stops answering ends the run with an
// error instead of a hang.
const defaultDrain = 5 * time.Second

// run keeps depth requests in flight until end, then waits for the last
// answers; completions are counted in st (the connection's own). rng picks
// the keys.
func (h *h2conn) run(end time.Time, st *phaseStats, rng *rand.Rand) error {
	done := make(chan struct{})
	h.mu.Lock()
	if h.err != nil {
		h.mu.Unlock()
		return h.err
	}
	h.st, h.end, h.rng, h.done = st, end, rng, done
	h.flushLocked()
	h.mu.Unlock()
	timer := time.NewTimer(time.Until(end) + h.drain)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		// The reader may hold mu in a Write the server does not read:
		// the deadline unblocks it, and it fails the connection.
		_ = h.c.SetDeadline(time.Now())
		<-done
		h.mu.Lock()
		n := h.inflight
		h.err = fmt.Errorf("%d requests unanswered %s after the run's end (%w)", n, h.drain, h.err)
		h.mu.Unlock()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.st, h.rng = nil, nil
	return h.err
}

// flushLocked fills every free slot while the phase lasts, writes what is
// pending in one Write, and ends the phase once its last answer is in;
// the caller holds mu.
func (h *h2conn) flushLocked() {
	if h.err != nil {
		return
	}
	issuing := h.done != nil && time.Now().Before(h.end)
	now := nowNS()
	for issuing && h.inflight < h.depth && uint32(h.inflight) < h.maxStreams {
		k := h.rng.IntN(len(h.reqs))
		size := int64(len(h.reqs[k]))
		if size > h.streamWindow {
			h.failLocked(fmt.Errorf("the server's initial stream window (%d) is smaller than one request (%d bytes)", h.streamWindow, size))
			return
		}
		if size > h.sendWindow {
			break // wait for the server's WINDOW_UPDATE
		}
		id := h.nextID
		s := &h.slots[(id>>1)&h.mask]
		if s.busy {
			break // a straggler from len(slots) streams ago holds its slot
		}
		h.nextID += 2
		*s = slot{id: id, start: now, busy: true, data: s.data[:0]}
		h.inflight++
		h.sendWindow -= size
		h.out = appendFrame(h.out, http2.FrameHeaders, http2.FlagHeadersEndHeaders, id, h.block)
		h.out = appendFrame(h.out, http2.FrameData, http2.FlagDataEndStream, id, h.reqs[k])
	}
	if len(h.out) > 0 {
		_, err := h.c.Write(h.out)
		h.out = h.out[:0]
		if err != nil {
			h.failLocked(fmt.Errorf("write: %w", err))
			return
		}
	}
	if h.done != nil && !issuing && h.inflight == 0 {
		close(h.done)
		h.done = nil
	}
}

// fail ends the connection with err (the first error wins).
func (h *h2conn) fail(err error) {
	h.mu.Lock()
	h.failLocked(err)
	h.mu.Unlock()
}

func (h *h2conn) failLocked(err error) {
	if h.err == nil {
		h.err = err
		h.c.Close()
	}
	if h.done != nil {
		close(h.done)
		h.done = nil
	}
}

// emit is HPACK's callback for each header field of the block being
// decoded.
func (h *h2conn) emit(hf hpack.HeaderField) {
	s := h.cur
	switch hf.Name {
	case ":status":
		s.status = hf.Value == "200"
	case "grpc-status":
		s.sawGRPC, s.grpcOK = true, hf.Value == "0"
		if !s.grpcOK {
			s.grpcCode = hf.Value
		}
	}
}

// stream is the slot of stream id in flight, or nil.
func (h *h2conn) stream(id uint32) *slot {
	s := &h.slots[(id>>1)&h.mask]
	if s.busy && s.id == id {
		return s
	}
	return nil
}

// read is the connection's reader. It holds mu but while it waits in
// read: one lock per read, not per frame.
func (h *h2conn) read() {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.readLoop()
	h.failLocked(fmt.Errorf("read: %w", err))
	select {
	case <-h.settled:
	default:
		close(h.settled)
	}
}

func (h *h2conn) readLoop() error {
	for {
		var f http2.Frame
		var err error
		if h.br.Buffered() == 0 {
			// About to block in read: refill the slots, send what is
			// due, and let go of mu while waiting.
			h.flushLocked()
			h.mu.Unlock()
			f, err = h.fr.ReadFrame()
			h.mu.Lock()
			h.now = nowNS()
		} else {
			f, err = h.fr.ReadFrame()
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the server closed the connection")
			}
			return err
		}
		id := f.Header().StreamID
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				break
			}
			err := f.ForeachSetting(func(s http2.Setting) error {
				switch s.ID {
				case http2.SettingInitialWindowSize:
					h.streamWindow = int64(s.Val)
				case http2.SettingMaxConcurrentStreams:
					h.maxStreams = s.Val
				}
				return nil
			})
			_ = h.fw.WriteSettingsAck()
			if err != nil {
				return err
			}
			select {
			case <-h.settled:
			default:
				close(h.settled)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = h.fw.WritePing(true, f.Data)
			}
		case *http2.WindowUpdateFrame:
			if id == 0 {
				h.sendWindow += int64(f.Increment)
				over := h.sendWindow > 1<<31-1
				if over {
					return errors.New("the server's WINDOW_UPDATE overflows the connection window")
				}
			}
			// A stream's window: ours send their one message at once,
			// within the initial window (run checks it).
		case *http2.HeadersFrame:
			h.cur = h.stream(id)
			if h.cur == nil {
				h.cur = &h.discard
			}
			h.hdrEnd = f.StreamEnded()
			if err := h.headerBlock(id, f.HeaderBlockFragment(), f.HeadersEnded()); err != nil {
				return err
			}
			if f.HeadersEnded() {
				h.finish(id, h.cur, h.hdrEnd, nil)
			}
		case *http2.ContinuationFrame:
			if err := h.headerBlock(id, f.HeaderBlockFragment(), f.HeadersEnded()); err != nil {
				return err
			}
			if f.HeadersEnded() {
				h.finish(id, h.cur, h.hdrEnd, nil)
			}
		case *http2.DataFrame:
			n := int64(f.Length)
			if h.recvLeft -= n; h.recvLeft < 0 {
				return errors.New("the server sent past the connection's receive window")
			}
			if h.unacked += n; h.unacked >= windowStep {
				inc := uint32(h.unacked)
				h.recvLeft += h.unacked
				h.unacked = 0
				_ = h.fw.WriteWindowUpdate(0, inc)
			}
			s := h.stream(id)
			if s == nil {
				break
			}
			var bad error
			if s.blocks == 0 {
				bad = errors.New("DATA before the response's HEADERS")
			}
			s.data = append(s.data, f.Data()...)
			if len(s.data) > recvWindow {
				bad = errors.New("a stream's DATA past its receive window")
			}
			if f.StreamEnded() || bad != nil {
				h.finish(id, s, true, bad)
			}
		case *http2.RSTStreamFrame:
			if s := h.stream(id); s != nil {
				h.finish(id, s, true, fmt.Errorf("stream reset: %v", f.ErrCode))
			}
		case *http2.GoAwayFrame:
			return fmt.Errorf("goaway: %v", f.ErrCode)
		case *http2.PushPromiseFrame:
			return errors.New("PUSH_PROMISE after SETTINGS_ENABLE_PUSH 0")
		}
	}
}

// headerBlock feeds one fragment of a header block to HPACK (every block,
// so the decoder's table stays the server's).
func (h *h2conn) headerBlock(id uint32, frag []byte, end bool) error {
	if _, err := h.dec.Write(frag); err != nil {
		return fmt.Errorf("stream %d: hpack: %w", id, err)
	}
	if end {
		if err := h.dec.Close(); err != nil {
			return fmt.Errorf("stream %d: hpack: %w", id, err)
		}
		h.cur.blocks++
	}
	return nil
}

// finish counts stream id's answer when it ended (or failed), and frees
// its slot; the caller holds mu.
func (h *h2conn) finish(id uint32, s *slot, ended bool, bad error) {
	if s == &h.discard {
		*s = slot{}
		return
	}
	if !ended {
		return // the response's headers; the message and trailers follow
	}
	if bad == nil {
		bad = h.decode(s)
	}
	done := h.now
	if st := h.st; st != nil {
		switch {
		case bad != nil:
			st.errors++
			if st.firstErr == nil {
				st.firstErr = fmt.Errorf("stream %d: %w", id, bad)
			}
		case h.res.OverallCode == rlsv3.RateLimitResponse_OK:
			st.ok++
		default:
			st.over++
		}
		if st.record && bad == nil {
			st.lat = append(st.lat, time.Duration(done-s.start))
		}
	}
	s.busy = false
	h.inflight--
}

// decode checks a whole response and decodes its message into h.res.
func (h *h2conn) decode(s *slot) error {
	switch {
	case !s.status:
		return errors.New("http status not 200")
	case !s.sawGRPC:
		return errors.New("no grpc-status")
	case !s.grpcOK:
		return fmt.Errorf("grpc-status %s", s.grpcCode)
	case s.blocks != 2:
		return fmt.Errorf("%d header blocks, want headers and trailers", s.blocks)
	case len(s.data) < 5 || s.data[0] != 0 || int(binary.BigEndian.Uint32(s.data[1:5])) != len(s.data)-5:
		return fmt.Errorf("response message: %d bytes, not one uncompressed gRPC message", len(s.data))
	}
	// Envoy's type, decoded by vtprotobuf's code (rlsvt); its strings
	// alias s.data, which stays unchanged until h.res is read.
	return rlsvt.UnmarshalUnsafe(s.data[5:], &h.res)
}

func (h *h2conn) Close() { h.fail(errors.New("closed")) }
