package shed

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// ProblemType is the RFC 9457 problem type of the 503 answer to a shed
// request: "temporary-reduced-capacity" as defined by the IETF HTTPAPI
// RateLimit header fields draft (draft-ietf-httpapi-ratelimit-headers),
// which asks IANA to register it in the HTTP Problem Types registry under
// this URI.
const ProblemType = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

// ProblemTitle is the problem's human-readable summary.
const ProblemTitle = "Temporarily reduced capacity"

// DefaultRetryAfter is the Retry-After sent with a 503 when
// MiddlewareOptions.RetryAfter is zero.
const DefaultRetryAfter = time.Second

// MiddlewareOptions configure Middleware.
type MiddlewareOptions struct {
	// Priority classifies each request. Nil means PriorityDefault for all.
	Priority func(*http.Request) Priority
	// RetryAfter is advertised to shed clients, rounded up to whole seconds
	// with a minimum of 1. Zero means DefaultRetryAfter.
	RetryAfter time.Duration
	// Logger receives unexpected admission errors. Nil discards.
	Logger *slog.Logger
	// OnShed, if set, is called for every request the middleware answers
	// with 503 (the proxy counts them per route).
	OnShed func(*http.Request)
}

// Problem is the RFC 9457 body of a 503 answer.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Reason is an extension member: the shed reason (metric label value).
	Reason string `json:"reason"`
}

// Middleware admits each request through l: admitted requests run next and
// release their slot when it returns; shed requests get a 503 with
// Retry-After, Cache-Control: no-store and an application/problem+json body.
func Middleware(l *Limiter, opts MiddlewareOptions) func(http.Handler) http.Handler {
	return newMiddleware(func(r *http.Request, p Priority) (Permit, error) {
		return l.Acquire(r.Context(), p)
	}, opts)
}

type shedResponder struct {
	retryAfter string
	bodies     [numReasons][]byte
	log        *slog.Logger
}

func newMiddleware(acquire func(*http.Request, Priority) (Permit, error), opts MiddlewareOptions) func(http.Handler) http.Handler {
	ra := opts.RetryAfter
	if ra <= 0 {
		ra = DefaultRetryAfter
	}
	secs := max(int64((ra+time.Second-1)/time.Second), 1)
	resp := &shedResponder{retryAfter: strconv.FormatInt(secs, 10), log: opts.Logger}
	if resp.log == nil {
		resp.log = slog.New(slog.DiscardHandler)
	}
	for r := range Reason(numReasons) {
		body, err := json.Marshal(Problem{
			Type:   ProblemType,
			Title:  ProblemTitle,
			Status: http.StatusServiceUnavailable,
			Detail: "The server is shedding load (" + r.String() + "); retry after " + resp.retryAfter + "s.",
			Reason: r.String(),
		})
		if err != nil {
			panic(err) // a fixed struct of strings always marshals
		}
		resp.bodies[r] = body
	}
	priority, onShed := opts.Priority, opts.OnShed
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := PriorityDefault
			if priority != nil {
				p = priority(r)
			}
			permit, err := acquire(r, p)
			if err != nil {
				if onShed != nil {
					onShed(r)
				}
				resp.write(w, r, err)
				return
			}
			defer permit.Release()
			next.ServeHTTP(w, r)
		})
	}
}

func (s *shedResponder) write(w http.ResponseWriter, r *http.Request, err error) {
	reason, ok := ReasonOf(err)
	if !ok {
		s.log.Error("l7 shedding: admission failed", "path", r.URL.Path, "err", err)
		reason = ReasonAtLimit
	}
	if reason == ReasonCanceled && errors.Is(err, context.Canceled) {
		// The client is gone; the answer is for logs and proxies only.
		s.log.Debug("l7 shedding: client left the queue", "path", r.URL.Path)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Retry-After", s.retryAfter)
	h.Set("Cache-Control", "no-store")
	body := s.bodies[reason]
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(body)
}
