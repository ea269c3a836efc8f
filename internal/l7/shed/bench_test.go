package shed

import (
	"context"
	"testing"
)

// BenchmarkShedAcquire measures one Acquire+Release on the fast path (a
// free slot, an empty queue): serial, parallel on one limiter, with the
// adaptive limit's sampling.
func BenchmarkShedAcquire(b *testing.B) {
	ctx := context.Background()
	for _, lc := range []struct {
		name string
		cfg  Config
	}{
		{"", Config{MaxInFlight: 1 << 20}},
		{"-adaptive", Config{Adaptive: &AdaptiveConfig{InitialLimit: 1 << 19, MaxLimit: 1 << 20}}},
		{"-adaptive-sample8", Config{Adaptive: &AdaptiveConfig{InitialLimit: 1 << 19, MaxLimit: 1 << 20, SampleEvery: 8}}},
	} {
		acquireRelease := func(b *testing.B, l *Limiter) bool {
			p, err := l.Acquire(ctx, PriorityDefault)
			if err != nil {
				b.Error(err)
				return false
			}
			p.Release()
			return true
		}
		b.Run("serial"+lc.name, func(b *testing.B) {
			l, err := New(lc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if !acquireRelease(b, l) {
					return
				}
			}
		})
		b.Run("parallel"+lc.name, func(b *testing.B) {
			l, err := New(lc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if !acquireRelease(b, l) {
						return
					}
				}
			})
		})
	}
	b.Run("shed-at-limit", func(b *testing.B) {
		l, err := New(Config{MaxInFlight: 1})
		if err != nil {
			b.Fatal(err)
		}
		held, err := l.Acquire(ctx, PriorityDefault)
		if err != nil {
			b.Fatal(err)
		}
		defer held.Release()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Acquire(ctx, PriorityDefault); err == nil {
				b.Fatal("admitted over the limit")
			}
		}
	})
}

// TestFastPathDoesNotAllocate pins the benchmark's 0 allocs/op.
func TestFastPathDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	static, err := New(Config{MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	adaptive, err := New(Config{Adaptive: &AdaptiveConfig{}})
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*Limiter{"static": static, "adaptive": adaptive} {
		allocs := testing.AllocsPerRun(1000, func() {
			p, err := l.Acquire(ctx, PriorityCritical)
			if err != nil {
				t.Fatal(err)
			}
			p.Release()
		})
		if allocs != 0 {
			t.Errorf("%s fast path: %v allocs per Acquire+Release, want 0", name, allocs)
		}
	}
	shedding, err := New(Config{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, shedding, PriorityDefault)
	defer held.Release()
	if allocs := testing.AllocsPerRun(1000, func() { _, _ = shedding.Acquire(ctx, PriorityDefault) }); allocs != 0 {
		t.Errorf("immediate shed: %v allocs, want 0", allocs)
	}
}
