package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// h2conn is a minimal gRPC client on one HTTP/2 connection: every request
// is a pre-encoded HEADERS block and a pre-encoded DATA frame (the gRPC
// message as Envoy's types marshal it, built once per key), many streams in
// flight on the connection; every response is read whole (headers, the
// message, the trailers), its grpc-status checked and its message decoded
// with Envoy's types. It exists so that the load generator costs less CPU
// than grpc-go's client on the 2 cores it shares with the service; it is
// used identically for every peer. Flow control: the connection's send
// window is honoured; received DATA is returned to the server at once.
type h2conn struct {
	c     net.Conn
	fr    *http2.Framer
	bw    *bufio.Writer
	block []byte // the request's header block (no dynamic table)

	wmu    sync.Mutex // writes, stream ids, the send window
	wcond  *sync.Cond
	nextID uint32
	window int64 // connection-level send window

	mu      sync.Mutex
	pending map[uint32]*h2call
	err     error // set once the connection failed
}

// h2call is one request in flight.
type h2call struct {
	status int
	grpc   string
	data   []byte
	done   chan error
}

func dialH2(target string) (*h2conn, error) {
	c, err := net.Dial("tcp", target)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, err
	}
	bw := bufio.NewWriterSize(c, 64<<10)
	fr := http2.NewFramer(bw, bufio.NewReaderSize(c, 64<<10))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	h := &h2conn{c: c, fr: fr, bw: bw, nextID: 1, window: 65535, pending: map[uint32]*h2call{}}
	h.wcond = sync.NewCond(&h.wmu)
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
	// A large receive window: responses never wait for our updates.
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		c.Close()
		return nil, err
	}
	if err := fr.WriteWindowUpdate(0, 1<<30-65535); err != nil {
		c.Close()
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		c.Close()
		return nil, err
	}
	go h.read()
	return h, nil
}

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

// call sends one pre-encoded request (framed by grpcFrame) and decodes the
// response into res.
func (h *h2conn) call(framed []byte, cl *h2call, res *rlsv3.RateLimitResponse) error {
	cl.status, cl.grpc, cl.data = 0, "", cl.data[:0]
	h.wmu.Lock()
	for h.window < int64(len(framed)) && h.failed() == nil {
		h.wcond.Wait()
	}
	if err := h.failed(); err != nil {
		h.wmu.Unlock()
		return err
	}
	id := h.nextID
	h.nextID += 2
	h.window -= int64(len(framed))
	h.mu.Lock()
	h.pending[id] = cl
	h.mu.Unlock()
	err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block, EndHeaders: true})
	if err == nil {
		err = h.fr.WriteData(id, true, framed)
	}
	if err == nil {
		err = h.bw.Flush()
	}
	h.wmu.Unlock()
	if err != nil {
		h.fail(err)
	}
	if err := <-cl.done; err != nil {
		return err
	}
	switch {
	case cl.status != 200:
		return fmt.Errorf("http status %d", cl.status)
	case cl.grpc != "0":
		return fmt.Errorf("grpc-status %q", cl.grpc)
	case len(cl.data) < 5 || cl.data[0] != 0 || int(binary.BigEndian.Uint32(cl.data[1:5])) != len(cl.data)-5:
		return fmt.Errorf("response message: %d bytes, not one uncompressed gRPC message", len(cl.data))
	}
	return proto.Unmarshal(cl.data[5:], res)
}

func (h *h2conn) failed() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// fail ends the connection: every call in flight gets err.
func (h *h2conn) fail(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.err = err
		for id, cl := range h.pending {
			delete(h.pending, id)
			cl.done <- err
		}
	}
	h.mu.Unlock()
	h.wmu.Lock()
	h.wcond.Broadcast()
	h.wmu.Unlock()
	h.c.Close()
}

func (h *h2conn) write(f func() error) {
	h.wmu.Lock()
	err := f()
	if err == nil {
		err = h.bw.Flush()
	}
	h.wmu.Unlock()
	if err != nil {
		h.fail(err)
	}
}

func (h *h2conn) read() {
	var unacked uint32
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.fail(fmt.Errorf("read: %w", err))
			return
		}
		id := f.Header().StreamID
		h.mu.Lock()
		cl := h.pending[id]
		h.mu.Unlock()
		end := false
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.write(h.fr.WriteSettingsAck)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.write(func() error { return h.fr.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			if id == 0 {
				h.wmu.Lock()
				h.window += int64(f.Increment)
				h.wcond.Broadcast()
				h.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			if cl != nil {
				for _, hf := range f.Fields {
					switch hf.Name {
					case ":status":
						cl.status, _ = strconv.Atoi(hf.Value)
					case "grpc-status":
						cl.grpc = hf.Value
					}
				}
			}
			end = f.StreamEnded()
		case *http2.DataFrame:
			if cl != nil {
				cl.data = append(cl.data, f.Data()...)
			}
			if unacked += uint32(len(f.Data())); unacked > 1<<20 {
				n := unacked
				unacked = 0
				h.write(func() error { return h.fr.WriteWindowUpdate(0, n) })
			}
			end = f.StreamEnded()
		case *http2.RSTStreamFrame:
			if cl != nil {
				h.finish(id, cl, fmt.Errorf("stream reset: %v", f.ErrCode))
			}
		case *http2.GoAwayFrame:
			h.fail(fmt.Errorf("goaway: %v", f.ErrCode))
			return
		}
		if end && cl != nil {
			h.finish(id, cl, nil)
		}
	}
}

func (h *h2conn) finish(id uint32, cl *h2call, err error) {
	h.mu.Lock()
	if h.pending[id] == cl {
		delete(h.pending, id)
		cl.done <- err
	}
	h.mu.Unlock()
}

func (h *h2conn) Close() { h.fail(errors.New("closed")) }
