package rls

import (
	"context"
	"errors"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"

	"github.com/edgeguard/edgeguard/internal/grpcunary"
)

// shouldRateLimitPath is the method the gRPC listeners serve.
const shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// grpcMethod is ShouldRateLimit on the gRPC transport (grpcunary): a
// Service without Redis limits decides on the connection's reader (its
// decisions never wait on the network); one with Redis limits decides a
// call on the reader too when every Redis group it charges answers from
// its hybrid leases (tryShouldRateLimit), and on a worker otherwise, with
// the call's grpc-timeout as the context's deadline.
func (s *Server) grpcMethod() grpcunary.Method {
	return grpcunary.Method{
		Path: shouldRateLimitPath,
		Inline: func() bool {
			svc := s.acquire()
			return svc == nil || !svc.waits()
		},
		Call: s.callShouldRateLimit,
		Try:  s.tryShouldRateLimit,
	}
}

// tryShouldRateLimit is callShouldRateLimit on the reader, for a Service
// with Redis limits: done is false, nothing decided, when the decision
// would wait on Redis (Service.tryDecide).
func (s *Server) tryShouldRateLimit(msg, dst []byte) ([]byte, codes.Code, string, bool) {
	svc := s.acquire()
	if svc == nil || !svc.tries {
		return dst, codes.OK, "", false
	}
	defer s.release(svc)
	var req Request
	if err := decodeRequest(msg, &req); err != nil {
		return dst, codes.Internal, "grpc: error unmarshalling request: " + err.Error(), true
	}
	start := svc.logStart()
	v, done, err := svc.tryDecide(&req)
	if !done {
		return dst, codes.OK, "", false
	}
	out, code, text := answer(svc, dst, &req, v, err, start)
	return out, code, text, true
}

// callShouldRateLimit decodes a request message, decides it and appends
// the response message to dst.
func (s *Server) callShouldRateLimit(ctx context.Context, msg, dst []byte) ([]byte, codes.Code, string) {
	var req Request
	if err := decodeRequest(msg, &req); err != nil {
		return dst, codes.Internal, "grpc: error unmarshalling request: " + err.Error()
	}
	svc := s.acquire()
	if svc == nil {
		return dst, codes.Unavailable, "rate-limit service is not configured"
	}
	defer s.release(svc)
	start := svc.logStart()
	v, err := svc.Decide(ctx, &req)
	return answer(svc, dst, &req, v, err, start)
}

// answer logs a decision made since start and appends its response
// message to dst, or returns its status: a malformed request is
// InvalidArgument; a decision that could not be made (the deadline passed
// while Redis was asked) is Unavailable: Envoy then applies its
// failure_mode_deny.
func answer(svc *Service, dst []byte, req *Request, v Verdict, err error, start time.Time) ([]byte, codes.Code, string) {
	svc.logDecision("grpc", req, &v, err, start)
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			return dst, codes.InvalidArgument, err.Error()
		}
		return dst, codes.Unavailable, err.Error()
	}
	out, err := appendResponse(dst, &v)
	if err != nil {
		return dst, codes.Internal, err.Error()
	}
	return out, codes.OK, ""
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
