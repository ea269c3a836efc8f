package refmodel_test

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// TestArrivalsAgainstFloodTiming replays the netns scenario "users arriving
// during an attack" (test/netns, TestKnownGoodUsersArrivingDuringAttack)
// through the reference model, on exact clocks: 1,500 new bots at 10/s each
// in the users' ASN (7.5× its 2,000/s budget, reserve 50%), 16 established
// users and 16 new arriving streams, both bursty (bursts of 3 back to back,
// 6/s on average). A new packet passes when it finds the ASN bucket below
// the new-source tolerance. The flood is replayed two ways, the two
// schedules trafficgen.Flood with Deadlines sends (each frame at its own
// time, from a SCHED_FIFO thread): Poisson gaps (independent bots; the
// netns scenario's flood), and evenly spaced (Poisson off; the scenario's
// own quiet-machine measurement, 0.20× a bot packet's odds for the
// opening requests, is nearer this case). Against the
// Poisson flood the first request of an arriving burst gets what a bot
// packet gets (asserted: at least 0.8× its odds); against the evenly
// spaced one a packet at a random instant finds a token about half as
// often as a flood packet (the flood takes each refill within one gap),
// and the requests behind a burst's first almost never (asserted: under
// 0.75× a bot packet's odds).
func TestArrivalsAgainstFloodTiming(t *testing.T) {
	for _, poisson := range []bool{true, false} {
		r := simulateArrivals(t, poisson)
		t.Logf("poisson %v: bot packet %.1f%%; arrivals' opening requests %.1f%% (%d), all requests %.1f%%; established users %.1f%%",
			poisson, 100*r.bot, 100*r.opening, r.openings, 100*r.arrivals, 100*r.users)
		if r.users < 0.99 {
			t.Errorf("poisson %v: established users %.1f%%, want ≥ 99%%", poisson, 100*r.users)
		}
		if poisson && r.opening < 0.8*r.bot {
			t.Errorf("poisson flood: arrivals' opening requests %.1f%%, want about a bot packet's %.1f%% (at least 0.8×)",
				100*r.opening, 100*r.bot)
		}
		if !poisson && r.opening > 0.75*r.bot {
			t.Errorf("evenly spaced flood: arrivals' opening requests %.1f%%, expected well under a bot packet's %.1f%% (0.75×)",
				100*r.opening, 100*r.bot)
		}
	}
}

type arrivalRun struct {
	bot, opening, arrivals, users float64
	openings                      int
}

type simPacket struct {
	at     uint64 // ns
	src    netip.Addr
	kind   int // 0 bot, 1 established user, 2 arrival
	opener bool
}

func simulateArrivals(t *testing.T, poisson bool) arrivalRun {
	t.Helper()
	const (
		bots, botRate = 1500, 10
		attack        = 13 * time.Second
		userRate      = 6
		burst         = 3
		burstGap      = 20 * time.Microsecond // back to back, as sendto(2) calls go
	)
	rng := rand.New(rand.NewPCG(11, 12))
	limit := func(n, b uint64) policy.Limit {
		return policy.Limit{Rate: policy.Rate{Count: n, Per: time.Second}, Burst: b}
	}
	c := &policy.Compiled{
		Mode: policy.ModeEnforce, Malformed: policy.VerdictPass,
		Rules: []policy.CompiledRule{{
			ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64},
			PerSource: policy.Bucket{Packets: limit(50, 100)},
			PerPrefix: policy.Bucket{Packets: limit(1000, 1000)}, Aggregate: policy.AggregateDerived,
			AggregateKey: policy.KeyBits{V4: 24, V6: 48},
			PerASN:       policy.Bucket{Packets: limit(2000, 2000)}, Reserve: 500_000,
		}},
		Prefixes: []policy.PrefixFact{{Prefix: netip.MustParsePrefix("198.18.0.0/16"), ASN: 64501}},
		Standing: policy.Standing{EstablishedAfter: 4 * time.Second, Penalty: 5 * time.Minute},
	}
	m := refmodel.New(16, 1<<16)
	if err := m.Apply(c); err != nil {
		t.Fatal(err)
	}
	const start = uint64(100 * time.Second) // a clock well past zero
	var pkts []simPacket
	// The flood: frame n from bot n mod 1,500, at 15,000/s.
	total := int(attack.Seconds() * bots * botRate)
	gap := float64(time.Second) / (bots * botRate)
	at := float64(start)
	for n := 0; n < total; n++ {
		if poisson {
			at += rng.ExpFloat64() * gap
		} else {
			at = float64(start) + float64(n)*gap
		}
		i := n % bots
		src := netip.AddrFrom4([4]byte{198, 18, byte(100 + i/25), byte(1 + i%25)})
		pkts = append(pkts, simPacket{at: uint64(at), src: src})
	}
	// Bursty streams: users (established) in 198.18.0-7.0/24, arrivals
	// (new) in 198.18.8-15.0/24, two streams per address.
	stream := func(src netip.Addr, kind int) {
		mean := float64(time.Second) * burst / userRate
		for t := float64(start) + rng.ExpFloat64()*mean; t < float64(start)+float64(attack); t += rng.ExpFloat64() * mean {
			for k := 0; k < burst; k++ {
				pkts = append(pkts, simPacket{at: uint64(t) + uint64(k)*uint64(burstGap), src: src, kind: kind, opener: k == 0})
			}
		}
	}
	for i := 0; i < 8; i++ {
		for _, kind := range []int{1, 2} {
			a := netip.AddrFrom4([4]byte{198, 18, byte(i + 8*(kind-1)), 10})
			if kind == 1 {
				m.SetStanding(maps.StandingKey(a), maps.StandingEstablished, maps.WhySet, start-uint64(time.Minute))
			}
			stream(a, kind)
			stream(a, kind)
		}
	}
	slices.SortStableFunc(pkts, func(a, b simPacket) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	var sent, passed [3]int
	var openings, openPassed int
	for _, p := range pkts {
		frame := packet.Frame{Src: p.src, Proto: packet.ProtoUDP, SrcPort: 5000, DstPort: 7, Payload: 16}.Build()
		ok := m.Run(frame, p.at).Passes()
		sent[p.kind]++
		if ok {
			passed[p.kind]++
		}
		if p.kind == 2 && p.opener {
			openings++
			if ok {
				openPassed++
			}
		}
	}
	return arrivalRun{
		bot: float64(passed[0]) / float64(sent[0]), users: float64(passed[1]) / float64(sent[1]),
		arrivals: float64(passed[2]) / float64(sent[2]), opening: float64(openPassed) / float64(openings), openings: openings,
	}
}
