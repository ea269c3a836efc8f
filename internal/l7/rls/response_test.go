package rls

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// responseMessage is v in Envoy's terms, built with Envoy's types: the
// reference appendResponse's bytes are held equal to.
func responseMessage(v *Verdict) *rlsv3.RateLimitResponse {
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

// rateLimit is a limit as Envoy's RateLimit.
func rateLimit(l *LimitStatus) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: uint32(min(l.Count, 1<<32-1))}
	var m uint32
	rl.Unit, m = limitUnit(l.Per)
	if m != 0 {
		rl.UnitMultiplier = wrapperspb.UInt32(m)
	}
	return rl
}
