package rls

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/edgeguard/edgeguard/internal/l7/class"
)

// BenchmarkDecideClasses is one decision (an aggregate and a per-client
// descriptor, local limits) over 4,096 clients without and with the class
// ranking, in the same run: the ranking's cost per request is the
// difference (docs/benchmarks.md, "Rate-limit service").
func BenchmarkDecideClasses(b *testing.B) {
	_, cfg := decodeL7(b, `
l7:
  rls:
    listen: 127.0.0.1:0
    rules:
      - {name: everyone, domain: edge, descriptor: [generic_key=api], limits: [{name: everyone, rate: 1000000000/s}]}
      - {name: per-ip, domain: edge, descriptor: [remote_address], limits: [{name: per-ip, rate: 1000000/s}]}
`)
	reqs := make([]Request, 4096)
	for i := range reqs {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		reqs[i] = Request{Domain: "edge", Descriptors: []Descriptor{
			{Entries: []Entry{{Key: "generic_key", Value: "api"}}},
			{Entries: []Entry{{Key: "remote_address", Value: a.String()}}},
		}}
	}
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("classes=%t", on), func(b *testing.B) {
			c := *cfg
			c.Classes.Enabled = on
			svc, err := New(&c, Options{Classes: class.NewTable(0, nil, nil, class.Config{})})
			if err != nil {
				b.Fatal(err)
			}
			defer svc.Close()
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if v, err := svc.Decide(ctx, &reqs[i&4095]); err != nil || !v.Allowed {
					b.Fatalf("%v %v", v, err)
				}
				i++
			}
		})
	}
}
