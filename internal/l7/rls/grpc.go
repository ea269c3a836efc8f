package rls

import (
	"context"
	"errors"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	var req Request
	if err := decodeRequest(msg, &req); err != nil {
		return dst, codes.Internal, "grpc: error unmarshalling request: " + err.Error()
	}
	v, err := s.shouldRateLimit(ctx, &req)
	if err != nil {
		st := status.Convert(err)
		return dst, st.Code(), st.Message()
	}
	out, err := appendResponse(dst, &v)
	if err != nil {
		return dst, codes.Internal, err.Error()
	}
	return out, codes.OK, ""
}

// shouldRateLimit answers one of Envoy's questions. A malformed request
// is InvalidArgument; a decision that could not be made (the deadline
// passed while Redis was asked) is Unavailable: Envoy then applies its
// failure_mode_deny.
func (s *Server) shouldRateLimit(ctx context.Context, req *Request) (Verdict, error) {
	svc := s.acquire()
	if svc == nil {
		return Verdict{}, status.Error(codes.Unavailable, "rate-limit service is not configured")
	}
	defer s.release(svc)
	start := time.Now()
	v, err := svc.Decide(ctx, req)
	svc.logDecision("grpc", req, &v, err, time.Since(start))
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			return Verdict{}, status.Error(codes.InvalidArgument, err.Error())
		}
		return Verdict{}, status.Error(codes.Unavailable, err.Error())
	}
	return v, nil
}

// limitUnit is a window as Envoy's RateLimit says it: the largest unit
// that divides it, times unit_multiplier (10s is SECOND with multiplier
// 10; 0 means none). A window below a second or not whole seconds is
// UNKNOWN, as Envoy's RateLimit cannot say it; the name and count remain.
func limitUnit(per time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range [...]struct {
		d time.Duration
		u rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if per >= u.d && per%u.d == 0 {
			if m := per / u.d; m != 1 {
				return u.u, uint32(min(int64(m), 1<<32-1))
			}
			return u.u, 0
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}
