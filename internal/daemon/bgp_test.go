package daemon

import (
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/shield"
)

// TestFlowSpecMatches: a fingerprint's fields become the rule's
// components for each destination; the TTL is left out (and said so), a
// source keeps the rule to its family, an IPv6 destination needs a
// length of at least the header, and a fingerprint left with its
// protocol alone is refused.
func TestFlowSpecMatches(t *testing.T) {
	dsts := []netip.Prefix{netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("fd00::1/128")}
	src := netip.MustParsePrefix("198.18.100.0/24")
	for _, c := range []struct {
		name string
		fp   shield.Fingerprint
		want []string // Match.String() per rule
		note string
		err  bool
	}{
		{"port and length", shield.Fingerprint{Mask: shield.FProto | shield.FDPort | shield.FLen, Proto: 17, DPort: 53, Len: 128},
			[]string{"dst 198.18.0.1/32 proto 17 dport 53 len 128", "dst fd00::1/128 proto 17 dport 53 len 128"}, "", false},
		{"ttl left out", shield.Fingerprint{Mask: shield.FProto | shield.FDPort | shield.FTTL, Proto: 17, DPort: 53, TTL: 64},
			[]string{"dst 198.18.0.1/32 proto 17 dport 53", "dst fd00::1/128 proto 17 dport 53"}, "ttl 64 not matched", false},
		{"protocol alone refused", shield.Fingerprint{Mask: shield.FProto | shield.FTTL, Proto: 17, TTL: 64}, nil, "", true},
		{"source keeps its family", shield.Fingerprint{Mask: shield.FProto | shield.FSrc, Proto: 6, Src: src},
			[]string{"dst 198.18.0.1/32 src 198.18.100.0/24 proto 6"}, "", false},
		{"tcp flags and sport", shield.Fingerprint{Mask: shield.FProto | shield.FSPort | shield.FTCPFlags, Proto: 6, SPort: 80, TCPFlags: 0x12},
			[]string{"dst 198.18.0.1/32 proto 6 sport 80 tcp_flags 0x12", "dst fd00::1/128 proto 6 sport 80 tcp_flags 0x12"}, "", false},
		{"too short for IPv6", shield.Fingerprint{Mask: shield.FProto | shield.FLen, Proto: 17, Len: 28},
			[]string{"dst 198.18.0.1/32 proto 17 len 28"}, "", false},
	} {
		ms, note, err := flowSpecMatches(c.fp, dsts)
		if (err != nil) != c.err {
			t.Errorf("%s: err %v", c.name, err)
			continue
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.String())
		}
		if strings.Join(got, "; ") != strings.Join(c.want, "; ") || !strings.Contains(note, c.note) {
			t.Errorf("%s: %q note %q, want %q note %q", c.name, got, note, c.want, c.note)
		}
	}
}

// TestBGPDeployedQueries: every edgeguard_bgp_* series the alerts read is
// one the BGP collector exports (without a bgp: section too).
func TestBGPDeployedQueries(t *testing.T) {
	d := newDaemon(Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newBGPCollector(d))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
	}
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	read := regexp.MustCompile(`edgeguard_bgp_[a-z_]+`).FindAllString(string(b), -1)
	if len(read) == 0 {
		t.Error("alerts.yml reads no edgeguard_bgp_* series")
	}
	for _, n := range read {
		if !exported[n] {
			t.Errorf("alerts.yml reads %s, which the BGP collector does not export (it exports %v)", n, exported)
		}
	}
}
