package rls

import (
	"context"
	"errors"
)

// errWouldWait is decide's answer, in try mode, for a request one of whose
// Redis groups needs a round trip: nothing was charged, ranked or counted.
var errWouldWait = errors.New("rls: the decision would wait on redis")

// tryDecide is Decide for the gRPC reader: it decides req, exactly as
// Decide would, when no Redis group of it needs a round trip (hybrid
// limits answered from their leases: redislimit.Limiter.Ready), and
// otherwise reports false having done nothing, for Decide on a worker.
// A lease another call uses up between the test and the charge makes this
// call sync as Decide does (on the reader, bounded by the Redis timeout).
func (s *Service) tryDecide(req *Request) (Verdict, bool, error) {
	if !s.tries {
		return Verdict{}, false, nil
	}
	v, err := s.decide(context.Background(), req, false, true)
	if errors.Is(err, errWouldWait) {
		return Verdict{}, false, nil
	}
	s.count(v, err)
	return v, true, err
}

// ready reports whether every Redis group the prepared descriptors charge
// decides without a round trip.
func (s *Service) ready(ps []prepared) bool {
	for i := range ps {
		p := &ps[i]
		if p.r == nil || p.n == 0 {
			continue
		}
		for _, g := range p.set.groups {
			if !g.lim.Ready(p.key, p.n) {
				return false
			}
		}
	}
	return true
}
