package rls

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// FuzzDecide: any request, however malformed, is answered or refused with
// ErrInvalid, never a panic; an answer has one status per descriptor.
func FuzzDecide(f *testing.F) {
	_, cfg := decodeL7(f, `
l7:
  rls:
    listen: 127.0.0.1:0
    rules:
      - {name: ip, domain: edge, descriptor: [remote_address], limits: [{name: a, rate: 3/min}]}
      - name: t
        domain: edge
        descriptor: [plan, k]
        limits: [{name: b, rate: 5/s, algorithm: sliding_log}, {name: c, rate: 1/s, shadow: true}]
        tiers: {entry: plan, levels: {pro: [{name: d, rate: 2/s, algorithm: token-bucket}]}}
`)
	svc, err := New(cfg, Options{Clock: new(l7test.ManualClock)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(svc.Close)
	for _, seed := range []string{
		"edge|remote_address=192.0.2.1", "edge|plan=pro,k=x|remote_address=::1", "|", "edge|", "edge|=",
		"edge|remote_address=999.1.1.1", "edge|plan=pro,k=" + strings.Repeat("v", 2000), "x|a=b,c=d,e=f",
		"edge|remote_address=192.0.2.1|remote_address=192.0.2.1|remote_address=192.0.2.1|remote_address=192.0.2.1",
	} {
		f.Add(seed, uint32(0))
		f.Add(seed, uint32(7))
	}
	f.Fuzz(func(t *testing.T, s string, hits uint32) {
		parts := strings.Split(s, "|")
		req := Request{Domain: parts[0], HitsAddend: uint64(hits)}
		for _, p := range parts[1:] {
			var d Descriptor
			for _, e := range strings.Split(p, ",") {
				k, v, _ := strings.Cut(e, "=")
				d.Entries = append(d.Entries, Entry{Key: k, Value: v})
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		v, err := svc.Decide(context.Background(), &req)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: %v, want an answer or ErrInvalid", s, err)
			}
			return
		}
		if len(v.Statuses) != len(req.Descriptors) {
			t.Fatalf("%q: %d statuses for %d descriptors", s, len(v.Statuses), len(req.Descriptors))
		}
		if !v.Allowed && v.Refused == "" {
			t.Fatalf("%q: refused without a refusing limit", s)
		}
	})
}
