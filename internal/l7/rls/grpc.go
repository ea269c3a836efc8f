package rls

import (
	"context"
	"errors"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeguard/edgeguard/internal/grpcunary"
)

// shouldRateLimitPath is the method the gRPC listeners serve.
const shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// grpcMethod is ShouldRateLimit on the gRPC transport (grpcunary): a
// Service without Redis limits decides on the connection's reader (its
// decisions never wait on the network); one with Redis limits on
// workers, with the call's grpc-timeout as the context's deadline.
func (s *Server) grpcMethod() grpcunary.Method {
	return grpcunary.Method{
		Path: shouldRateLimitPath,
		Inline: func() bool {
			svc := s.acquire()
			return svc == nil || !svc.waits()
		},
		Call: s.callShouldRateLimit,
	}
}

// callShouldRateLimit decodes a request message, decides it and appends
// the response message to dst.
func (s *Server) callShouldRateLimit(ctx context.Context, msg, dst []byte) ([]byte, codes.Code, string) {
	var in rlsv3.RateLimitRequest
	if err := unmarshalRequest(msg, &in); err != nil {
		return dst, codes.Internal, "grpc: error unmarshalling request: " + err.Error()
	}
	res, err := s.shouldRateLimit(ctx, &in)
	if err != nil {
		st := status.Convert(err)
		return dst, st.Code(), st.Message()
	}
	out, err := appendResponse(dst, res)
	if err != nil {
		return dst, codes.Internal, err.Error()
	}
	return out, codes.OK, ""
}

// shouldRateLimit answers one of Envoy's questions. A malformed request
// is InvalidArgument; a decision that could not be made (the deadline
// passed while Redis was asked) is Unavailable: Envoy then applies its
// failure_mode_deny.
func (s *Server) shouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	svc := s.acquire()
	if svc == nil {
		return nil, status.Error(codes.Unavailable, "rate-limit service is not configured")
	}
	defer s.release(svc)
	start := time.Now()
	req := Request{Domain: in.GetDomain(), HitsAddend: uint64(in.GetHitsAddend()), Descriptors: make([]Descriptor, len(in.GetDescriptors()))}
	for i, d := range in.GetDescriptors() {
		if d == nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d is empty", i)
		}
		es := make([]Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			es[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		req.Descriptors[i].Entries = es
		if h := d.GetHitsAddend(); h != nil {
			req.Descriptors[i].Hits, req.Descriptors[i].HasHits = h.GetValue(), true
		}
	}
	v, err := svc.Decide(ctx, &req)
	svc.logDecision("grpc", &req, &v, err, time.Since(start))
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return Response(&v), nil
}

// Response is v in Envoy's terms.
func Response(v *Verdict) *rlsv3.RateLimitResponse {
	res := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(v.Statuses))}
	if !v.Allowed {
		res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for i := range v.Statuses {
		st := &v.Statuses[i]
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if st.Over {
			ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if c := st.Current; c != nil {
			ds.CurrentLimit = rateLimit(c)
			ds.LimitRemaining = uint32(min(max(st.Decision.Remaining, 0), 1<<32-1))
			reset := st.Decision.Reset
			if !st.Decision.Allowed {
				reset = st.Decision.RetryAfter
			}
			ds.DurationUntilReset = durationpb.New(reset)
		}
		res.Statuses[i] = ds
	}
	for _, h := range v.Headers {
		res.ResponseHeadersToAdd = append(res.ResponseHeadersToAdd, &corev3.HeaderValue{Key: h[0], Value: h[1]})
	}
	return res
}

// rateLimit is a limit as Envoy's RateLimit: count per the largest unit
// that divides the window, times unit_multiplier (100/10s is 100 per
// SECOND with multiplier 10).
func rateLimit(l *LimitStatus) *rlsv3.RateLimitResponse_RateLimit {
	units := []struct {
		d time.Duration
		u rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	}
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: uint32(min(l.Count, 1<<32-1))}
	for _, u := range units {
		if l.Per >= u.d && l.Per%u.d == 0 {
			rl.Unit = u.u
			if m := l.Per / u.d; m != 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(m), 1<<32-1)))
			}
			return rl
		}
	}
	// A window below a second or not whole seconds: UNKNOWN, as Envoy's
	// RateLimit cannot say it; the name and count remain.
	return rl
}
