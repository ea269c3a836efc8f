package capture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/packet"
)

// TestReadFramesRoundTrip: what NewWriter writes (pcapng, comments, cut
// to the snap length) and what a pcap writer writes read back with their
// bytes, lengths, times and verdict comments.
func TestReadFramesRoundTrip(t *testing.T) {
	long := frame(packet.Frame{Proto: packet.ProtoUDP, SrcPort: 4000, DstPort: 53, Payload: 300})
	short := frame(packet.Frame{Proto: packet.ProtoTCP, SrcPort: 4001, DstPort: 443, TCPFlags: 0x02})
	t0 := time.Unix(1700000000, 123456000).UTC()
	var ng bytes.Buffer
	w, err := NewWriter(&ng, FileInfo{Application: "test", SnapLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range []*control.CaptureFrame{
		{Time: t0, Data: long, Len: len(long), Action: "drop", Reason: "deny", Class: "unknown", Sampler: "1-in-N"},
		{Time: t0.Add(time.Millisecond), Data: short, Len: len(short), Action: "pass", Reason: "ok", Rule: "api", Class: "new", Sampler: "1-in-N"},
	} {
		if err := w.Write(f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	w.Flush()
	var pc bytes.Buffer
	pw := pcapgo.NewWriter(&pc)
	pw.WriteFileHeader(128, layers.LinkTypeEthernet)
	pw.WritePacket(gopacket.CaptureInfo{Timestamp: t0, CaptureLength: 128, Length: len(long)}, long[:128])
	pw.WritePacket(gopacket.CaptureInfo{Timestamp: t0.Add(time.Millisecond), CaptureLength: len(short), Length: len(short)}, short)
	for name, file := range map[string][]byte{"pcapng": ng.Bytes(), "pcap": pc.Bytes()} {
		fs, err := ReadFrames(file, 10)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(fs) != 2 {
			t.Fatalf("%s: %d frames, want 2", name, len(fs))
		}
		if !bytes.Equal(fs[0].Data, long[:128]) || fs[0].Len != len(long) || !bytes.Equal(fs[1].Data, short) || fs[1].Len != len(short) {
			t.Errorf("%s: frames %d/%d and %d/%d bytes, want the written ones", name, len(fs[0].Data), fs[0].Len, len(fs[1].Data), fs[1].Len)
		}
		if !fs[0].Time.Equal(t0) || fs[1].Time.Sub(fs[0].Time) != time.Millisecond {
			t.Errorf("%s: times %v %v", name, fs[0].Time, fs[1].Time)
		}
		if name == "pcapng" {
			v, r, ok := CommentVerdict(fs[1].Comment)
			if !ok || v != "pass" || r != "ok" {
				t.Errorf("comment %q read as %q %q %v", fs[1].Comment, v, r, ok)
			}
		} else if fs[0].Comment != "" {
			t.Errorf("pcap comment %q", fs[0].Comment)
		}
	}
	if _, _, ok := CommentVerdict("a frame of mine"); ok {
		t.Error("a foreign comment read as a verdict")
	}
}

// pcapFile is a pcap (microseconds, little endian) with the given header
// fields and raw records after it.
func pcapFile(snaplen, linkType uint32, records ...[]byte) []byte {
	h := make([]byte, 24)
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], snaplen)
	binary.LittleEndian.PutUint32(h[20:], linkType)
	for _, r := range records {
		h = append(h, r...)
	}
	return h
}

func pcapRecord(capLen, length uint32, data []byte) []byte {
	r := make([]byte, 16)
	binary.LittleEndian.PutUint32(r[8:], capLen)
	binary.LittleEndian.PutUint32(r[12:], length)
	return append(r, data...)
}

// TestReadFramesHostile: files cut short, lying about lengths, of other
// link types, too many frames, or not captures at all are refused with an
// error that says which, and nothing is allocated beyond the file's size.
func TestReadFramesHostile(t *testing.T) {
	f := frame(packet.Frame{Proto: packet.ProtoUDP, SrcPort: 1, DstPort: 2, Payload: 40})
	good := pcapRecord(uint32(len(f)), uint32(len(f)), f)
	var ng bytes.Buffer
	w, _ := NewWriter(&ng, FileInfo{SnapLen: 128})
	for range 2 {
		w.Write(&control.CaptureFrame{Time: time.Now(), Data: f, Len: len(f)})
	}
	w.Flush()
	var sll bytes.Buffer
	nw, _ := pcapgo.NewNgWriter(&sll, layers.LinkTypeLinuxSLL)
	nw.WritePacket(gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: len(f), Length: len(f)}, f)
	nw.Flush()
	huge := make([]byte, 70000)
	for _, tc := range []struct {
		name string
		file []byte
		max  int
		want string
	}{
		{"empty", nil, 10, "not a pcap or pcapng file"},
		{"text", []byte("GET / HTTP/1.1\r\n"), 10, "not a pcap or pcapng file"},
		{"header cut", pcapFile(128, 1)[:20], 10, "read pcap"},
		{"pcap frame cut", pcapFile(128, 1, good, good[:30]), 10, "frame 2"},
		{"pcapng frame cut", ng.Bytes()[:ng.Len()-20], 10, "frame 2"},
		{"huge snaplen and caplen", pcapFile(0xffffffff, 1, pcapRecord(0x7fffffff, 0x7fffffff, f)), 10, "frame 1"},
		{"caplen over length", pcapFile(128, 1, pcapRecord(uint32(len(f)), 10, f)), 10, "frame 1"},
		{"frame too long", pcapFile(0x40000, 1, pcapRecord(uint32(len(huge)), uint32(len(huge)), huge)), 10, "longer than any frame"},
		{"length too long", pcapFile(128, 1, pcapRecord(uint32(len(f)), 1<<30, f)), 10, "longer than any frame"},
		{"pcap linux sll", pcapFile(128, uint32(layers.LinkTypeLinuxSLL), good), 10, "only Ethernet"},
		{"pcap raw ip", pcapFile(128, uint32(layers.LinkTypeRaw), good), 10, "only Ethernet"},
		{"pcapng linux sll", sll.Bytes(), 10, "only Ethernet"},
		{"too many frames", pcapFile(128, 1, good, good, good), 2, "more than 2 frames"},
	} {
		fs, err := ReadFrames(tc.file, tc.max)
		t.Logf("%s: %v", tc.name, err)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %d frames, err %v; want an error with %q", tc.name, len(fs), err, tc.want)
		}
		if strings.Contains(tc.want, "Ethernet") && !errors.Is(err, ErrNotEthernet) {
			t.Errorf("%s: %v is not ErrNotEthernet", tc.name, err)
		}
	}
	if fs, err := ReadFrames(pcapFile(128, 1, good, good), 2); err != nil || len(fs) != 2 {
		t.Errorf("two frames at the bound of 2: %d, %v", len(fs), err)
	}
}
