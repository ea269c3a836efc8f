package main

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestGeneratorFrames runs the generator program with BPF_PROG_TEST_RUN
// (not live: the frame comes back) and checks that every source set writes
// addresses from its range, the IPv4 header checksum verifies, and the
// verdict is XDP_TX.
func TestGeneratorFrames(t *testing.T) {
	testenv.RequireRoot(t)
	frame, sum := floodFrame([6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2}, netip.MustParseAddr("198.18.0.1"), 9)
	cases := []struct {
		src    sources
		in     func(netip.Addr) bool
		minDis int // distinct sources expected in 256 runs
	}{
		{oneSource, func(a netip.Addr) bool { return a == netip.MustParseAddr("198.19.0.1") }, 1},
		{kSources, func(a netip.Addr) bool {
			return netip.MustParsePrefix("198.19.0.0/16").Contains(a) && a.As4()[3] < 4
		}, 200},
		{slash16, netip.MustParsePrefix("198.19.0.0/16").Contains, 250},
		{mSources, func(a netip.Addr) bool {
			b := a.As4()
			return netip.MustParsePrefix("100.0.0.0/8").Contains(a) && b[3] < 16
		}, 250},
		{wholeSpace, func(netip.Addr) bool { return true }, 250},
	}
	for _, tc := range cases {
		t.Run(tc.src.name, func(t *testing.T) {
			g, err := newGenerator(tc.src, frame, sum, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer g.close()
			seen := map[netip.Addr]bool{}
			out := make([]byte, len(frame))
			for i := 0; i < 256; i++ {
				ret, err := g.prog.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				if ret != xdpTX {
					t.Fatalf("verdict %d, want XDP_TX (%d)", ret, xdpTX)
				}
				src := netip.AddrFrom4([4]byte(out[saddrOff : saddrOff+4]))
				if !tc.in(src) {
					t.Fatalf("source %s outside the %s set", src, tc.src.name)
				}
				var s uint32
				for j := ipOff; j < ipOff+20; j += 2 {
					s += uint32(binary.BigEndian.Uint16(out[j:]))
				}
				for s > 0xffff {
					s = s&0xffff + s>>16
				}
				if s != 0xffff {
					t.Fatalf("source %s: ipv4 header checksum does not verify (sum %#x)", src, s)
				}
				if !equalExcept(frame, out, saddrOff, saddrOff+4, csumOff, csumOff+2) {
					t.Fatalf("source %s: bytes other than source and checksum changed", src)
				}
				seen[src] = true
			}
			if len(seen) < tc.minDis {
				t.Errorf("%d distinct sources in 256 runs, want at least %d", len(seen), tc.minDis)
			}
		})
	}
}

func equalExcept(a, b []byte, ranges ...int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		skip := false
		for r := 0; r+1 < len(ranges); r += 2 {
			skip = skip || (i >= ranges[r] && i < ranges[r+1])
		}
		if !skip && a[i] != b[i] {
			return false
		}
	}
	return true
}
