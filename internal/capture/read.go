package capture

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// MaxFrameLen is the longest frame a file may describe (its original
// length, not the bytes captured): an IP datagram's 65,535 bytes plus an
// Ethernet header and two VLAN tags. A longer one cannot be a frame the
// data plane decides (a capture of GRO/TSO super-frames, or a hostile
// file), and replaying it would need its bytes in memory.
const MaxFrameLen = 65535 + 14 + 8

// Frame is one frame read from a capture file.
type Frame struct {
	Time time.Time // zero when the file has none (simple packet blocks)
	Data []byte    // the bytes captured
	Len  int       // the frame's original length (>= len(Data))
	// Comment is the frame's pcapng comment, "" for none (edgectl
	// capture writes the verdict there, Comment).
	Comment string
}

// Magic numbers of the two formats (the first four bytes of a file).
var (
	pcapMagics = [][]byte{
		{0xd4, 0xc3, 0xb2, 0xa1}, {0xa1, 0xb2, 0xc3, 0xd4}, // microseconds
		{0x4d, 0x3c, 0xb2, 0xa1}, {0xa1, 0xb2, 0x3c, 0x4d}, // nanoseconds
	}
	pcapngMagic = []byte{0x0a, 0x0d, 0x0d, 0x0a}
)

// ErrNotEthernet is a capture file of another link type than Ethernet.
var ErrNotEthernet = errors.New("not an Ethernet capture")

// ReadFrames reads the frames of a pcap or pcapng file held in b (the
// caller bounds its size), at most maxFrames of them: more is an error,
// not a silent cut. Only Ethernet files are read (link type 1: what the
// XDP program sees); a pcapng file must have one link type for all its
// interfaces. A frame longer than MaxFrameLen, or with more bytes
// captured than its length, is an error naming the frame.
func ReadFrames(b []byte, maxFrames int) ([]Frame, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("read capture: %d bytes: not a pcap or pcapng file", len(b))
	}
	var next func() ([]byte, gopacket.CaptureInfo, string, error)
	switch {
	case bytes.Equal(b[:4], pcapngMagic):
		r, err := pcapgo.NewNgReader(bytes.NewReader(b), pcapgo.NgReaderOptions{})
		if err != nil {
			return nil, fmt.Errorf("read pcapng: %w", err)
		}
		if lt := r.LinkType(); lt != layers.LinkTypeEthernet {
			return nil, linkTypeError(lt)
		}
		next = func() ([]byte, gopacket.CaptureInfo, string, error) {
			data, ci, opts, err := r.ReadPacketDataWithOptions()
			c := ""
			if len(opts.Comments) > 0 {
				c = opts.Comments[0]
			}
			return data, ci, c, err
		}
	case isPcap(b[:4]):
		r, err := pcapgo.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("read pcap: %w", err)
		}
		if lt := r.LinkType(); lt != layers.LinkTypeEthernet {
			return nil, linkTypeError(lt)
		}
		next = func() ([]byte, gopacket.CaptureInfo, string, error) {
			data, ci, err := r.ReadPacketData()
			return data, ci, "", err
		}
	default:
		return nil, fmt.Errorf("read capture: magic %x: not a pcap or pcapng file", b[:4])
	}
	var out []Frame
	for i := 1; ; i++ {
		data, ci, comment, err := next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			if errors.Is(err, pcapgo.ErrNgLinkTypeMismatch) {
				return nil, fmt.Errorf("frame %d: %w: the file mixes link types", i, ErrNotEthernet)
			}
			return nil, fmt.Errorf("frame %d: %w (truncated or corrupt file)", i, err)
		}
		if i > maxFrames {
			return nil, fmt.Errorf("more than %d frames: cut the file (e.g. tcpdump -r IN -c %d -w OUT)", maxFrames, maxFrames)
		}
		if ci.Length > MaxFrameLen || len(data) > MaxFrameLen {
			return nil, fmt.Errorf("frame %d: %d bytes long: longer than any frame the data plane decides (%d)", i, max(ci.Length, len(data)), MaxFrameLen)
		}
		if ci.Length < len(data) {
			return nil, fmt.Errorf("frame %d: %d bytes captured of a %d-byte frame", i, len(data), ci.Length)
		}
		out = append(out, Frame{Time: ci.Timestamp, Data: bytes.Clone(data), Len: ci.Length, Comment: comment})
	}
}

func isPcap(m []byte) bool {
	for _, p := range pcapMagics {
		if bytes.Equal(m, p) {
			return true
		}
	}
	return false
}

func linkTypeError(lt layers.LinkType) error {
	return fmt.Errorf("%w: link type %s (%d); only Ethernet (1) frames are what the data plane decides (tcpdump: capture on the interface, not -i any)", ErrNotEthernet, lt, uint32(lt))
}

// CommentVerdict is the verdict and reason an `edgectl capture` comment
// records ("edgeguard verdict=drop reason=deny ..."), ok false when the
// comment is not one.
func CommentVerdict(c string) (verdict, reason string, ok bool) {
	var v, r string
	if n, _ := fmt.Sscanf(c, "edgeguard verdict=%s reason=%s", &v, &r); n != 2 {
		return "", "", false
	}
	return v, r, true
}
