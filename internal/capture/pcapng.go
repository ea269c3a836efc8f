package capture

import (
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/edgeguard/edgeguard/internal/control"
)

// FileInfo describes a capture file: its section and its one interface.
type FileInfo struct {
	Application string // e.g. "edgectl capture v1.2.3"
	Comment     string // the section's comment: what was captured, how
	Filter      string // the tcpdump expression, "" for none
	SnapLen     int
	Interfaces  []string // the daemon's interfaces, for the description
}

// Writer writes a pcapng file: one Ethernet interface standing for the
// data plane's samples, and one enhanced packet block per frame with the
// verdict in its comment (opt_comment), which Wireshark shows as the
// frame's comment (pkt_comment) and tcpdump skips.
type Writer struct {
	ng   *pcapgo.NgWriter
	snap int
}

// NewWriter writes the section and interface blocks to w.
func NewWriter(w io.Writer, info FileInfo) (*Writer, error) {
	intf := pcapgo.NgInterface{
		Name:                "edgeguard-samples",
		Description:         "frames sampled by the Edgeguard XDP program on " + strings.Join(info.Interfaces, ","),
		Filter:              info.Filter,
		OS:                  runtime.GOOS,
		LinkType:            layers.LinkTypeEthernet,
		TimestampResolution: 9,
		SnapLength:          uint32(info.SnapLen),
	}
	ng, err := pcapgo.NewNgWriterInterface(w, intf, pcapgo.NgWriterOptions{SectionInfo: pcapgo.NgSectionInfo{
		Hardware: runtime.GOARCH, OS: runtime.GOOS, Application: info.Application, Comment: info.Comment,
	}})
	if err != nil {
		return nil, fmt.Errorf("write pcapng header: %w", err)
	}
	return &Writer{ng: ng, snap: info.SnapLen}, nil
}

// Write writes one frame, cut to the snap length.
func (w *Writer) Write(f *control.CaptureFrame) error {
	data := f.Data
	if w.snap > 0 && len(data) > w.snap {
		data = data[:w.snap]
	}
	ci := gopacket.CaptureInfo{Timestamp: f.Time, CaptureLength: len(data), Length: max(f.Len, len(data))}
	if err := w.ng.WritePacketWithOptions(ci, data, pcapgo.NgPacketOptions{Comments: []string{Comment(f)}}); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// Flush writes out what is buffered.
func (w *Writer) Flush() error { return w.ng.Flush() }

// Comment is a frame's packet comment: space-separated key=value words,
// verdict first, e.g. "edgeguard verdict=drop reason=source_limit rule=api
// class=new sampler=drop".
func Comment(f *control.CaptureFrame) string {
	var b strings.Builder
	fmt.Fprintf(&b, "edgeguard verdict=%s reason=%s", f.Action, f.Reason)
	if f.Rule != "" {
		fmt.Fprintf(&b, " rule=%s", f.Rule)
	}
	fmt.Fprintf(&b, " class=%s", f.Class)
	if f.Refused != "" {
		fmt.Fprintf(&b, " refused=%s", f.Refused)
		if f.RefusedBy != "" {
			fmt.Fprintf(&b, " refused_by=%s", f.RefusedBy)
		}
	}
	fmt.Fprintf(&b, " sampler=%s", f.Sampler)
	if f.Weight > 0 {
		fmt.Fprintf(&b, " weight=%d", f.Weight)
	}
	return b.String()
}
