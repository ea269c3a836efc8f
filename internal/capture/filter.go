package capture

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/net/bpf"

	"github.com/edgeguard/edgeguard/internal/control"
)

// A filter is a tcpdump expression. It is compiled by tcpdump itself
// (tcpdump -ddd: libpcap's compiler, so the syntax and meaning are
// tcpdump's exactly) for the Ethernet link type, at the start of a
// capture, and run on each frame's sampled bytes by golang.org/x/net/bpf's
// interpreter. No Go library compiles pcap filters without cgo, and a
// hand-written subset would differ from tcpdump where operators least
// expect it.

// ErrNoTcpdump means a filter was given and tcpdump, which compiles it, is
// not installed.
var ErrNoTcpdump = errors.New("a capture filter is compiled by tcpdump, which is not installed (apt-get install tcpdump)")

// pcapHeader is an empty classic pcap file (Ethernet, snap length 65535)
// for tcpdump to read on stdin: reading a file, tcpdump compiles for its
// link type without opening a device, and without Linux's in-kernel
// extensions (in-band VLAN tags are read from the bytes, as samples carry
// them).
var pcapHeader = func() []byte {
	b := make([]byte, 24)
	le := binary.LittleEndian
	le.PutUint32(b[0:], 0xa1b2c3d4)
	le.PutUint16(b[4:], 2)
	le.PutUint16(b[6:], 4)
	le.PutUint32(b[16:], 65535)
	le.PutUint32(b[20:], 1) // LINKTYPE_ETHERNET
	return b
}()

// CompileFilter compiles a tcpdump expression with tcpdump -ddd. An empty
// expression compiles to nothing (every frame).
func CompileFilter(ctx context.Context, expr string) ([][4]uint32, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, nil
	}
	path, err := exec.LookPath("tcpdump")
	if err != nil {
		return nil, ErrNoTcpdump
	}
	cmd := exec.CommandContext(ctx, path, "-r", "-", "-ddd", "--", expr)
	cmd.Stdin = bytes.NewReader(pcapHeader)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("filter %q: %s", expr, tcpdumpError(stderr.String(), err))
	}
	prog, err := parseDDD(out.String())
	if err != nil {
		return nil, fmt.Errorf("filter %q: tcpdump -ddd: %w", expr, err)
	}
	return prog, nil
}

// tcpdumpError is tcpdump's own complaint, without its "reading from
// file" line.
func tcpdumpError(stderr string, err error) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "reading from file") {
			lines = append(lines, strings.TrimPrefix(l, "tcpdump: "))
		}
	}
	if len(lines) == 0 {
		return err.Error()
	}
	return strings.Join(lines, "; ")
}

// parseDDD reads tcpdump -ddd's output: the instruction count, then one
// "code jt jf k" line (decimal) each.
func parseDDD(s string) ([][4]uint32, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, errors.New("no output")
	}
	n, err := strconv.Atoi(fields[0])
	if err != nil || n < 1 || n > control.MaxCaptureProgram || len(fields) != 1+4*n {
		return nil, fmt.Errorf("unexpected output (%d fields, count %q)", len(fields), fields[0])
	}
	prog := make([][4]uint32, n)
	for i := range prog {
		for j, max := range [4]uint64{0xffff, 0xff, 0xff, 0xffffffff} {
			v, err := strconv.ParseUint(fields[1+4*i+j], 10, 64)
			if err != nil || v > max {
				return nil, fmt.Errorf("instruction %d: bad field %q", i, fields[1+4*i+j])
			}
			prog[i][j] = uint32(v)
		}
	}
	return prog, nil
}

// Matcher runs a compiled filter. Safe for concurrent use.
type Matcher struct {
	vm *bpf.VM
}

// NewMatcher checks a program (control.CaptureRequest.Program: it comes
// over the control socket, so it is checked as hostile: at most
// control.MaxCaptureProgram instructions, every jump inside the program,
// no division by zero, no unknown extension, a return at the end) and
// readies it. An empty program: nil, every frame matches.
func NewMatcher(prog [][4]uint32) (*Matcher, error) {
	if len(prog) == 0 {
		return nil, nil
	}
	if len(prog) > control.MaxCaptureProgram {
		return nil, fmt.Errorf("filter program: %d instructions, at most %d", len(prog), control.MaxCaptureProgram)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, in := range prog {
		if in[0] > 0xffff || in[1] > 0xff || in[2] > 0xff {
			return nil, fmt.Errorf("filter program: instruction %d out of range", i)
		}
		raw[i] = bpf.RawInstruction{Op: uint16(in[0]), Jt: uint8(in[1]), Jf: uint8(in[2]), K: in[3]}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		for i, in := range insns {
			if _, unknown := in.(bpf.RawInstruction); unknown {
				return nil, fmt.Errorf("filter program: instruction %d (%#x) is not classic BPF this interpreter runs", i, raw[i].Op)
			}
		}
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		return nil, fmt.Errorf("filter program: %w", err)
	}
	return &Matcher{vm: vm}, nil
}

// Match runs the filter on a frame's sampled bytes. A filter that reads
// past them does not match (as the kernel's filter on a short packet);
// a nil Matcher matches everything.
func (m *Matcher) Match(frame []byte) (ok bool) {
	if m == nil {
		return true
	}
	// The interpreter panics on nothing NewMatcher let through; if it
	// ever does, one frame does not match rather than the daemon dying.
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	n, err := m.vm.Run(frame)
	return err == nil && n > 0
}
