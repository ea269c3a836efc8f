package rls

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// DescriptorHeader is the request field of the subrequest endpoint that
// carries one descriptor: "key=value; key=value" (one field per
// descriptor, entries in order).
const DescriptorHeader = "Edgeguard-Descriptor"

// HitsHeader optionally sets the request's hits_addend.
const HitsHeader = "Edgeguard-Hits-Addend"

// HTTPHandler is the subrequest endpoint for nginx auth_request and
// Traefik ForwardAuth: /v1/check/{domain} with the descriptors in
// Edgeguard-Descriptor fields answers 200 (allowed) or 429 with
// Retry-After, the RateLimit headers and a problem body; ?refuse=403
// answers 403 instead of 429 (nginx's auth_request passes only 2xx, 401
// and 403: the shipped snippet turns that 403 back into a 429 for the
// client); ?forwarded=1 adds the descriptor [remote_address = the last
// address of X-Forwarded-For] (Traefik). A malformed request is 400; a
// decision that could not be made is 503.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/check/{domain}", func(w http.ResponseWriter, r *http.Request) {
		svc := s.acquire()
		if svc == nil {
			http.Error(w, "rate-limit service is not configured", http.StatusServiceUnavailable)
			return
		}
		start := svc.logStart()
		refuse := http.StatusTooManyRequests
		switch q := r.URL.Query().Get("refuse"); q {
		case "", "429":
		case "403":
			refuse = http.StatusForbidden
		default:
			http.Error(w, "refuse: want 429 or 403", http.StatusBadRequest)
			return
		}
		req, err := parseHTTP(r, svc.cfg.TrustedProxies)
		var v Verdict
		if err == nil {
			v, err = svc.Decide(r.Context(), &req)
		}
		svc.logDecision("http", &req, &v, err, start)
		if err != nil {
			code := http.StatusServiceUnavailable
			if errors.Is(err, ErrInvalid) {
				code = http.StatusBadRequest
			}
			http.Error(w, err.Error(), code)
			return
		}
		h := w.Header()
		for _, kv := range v.Headers {
			h.Set(kv[0], kv[1])
		}
		if v.Allowed {
			w.WriteHeader(http.StatusOK)
			return
		}
		var retry int64
		for _, kv := range v.Headers {
			if kv[0] == "Retry-After" {
				retry, _ = strconv.ParseInt(kv[1], 10, 64)
				h.Del("Retry-After") // WriteProblem writes it
			}
		}
		var violated []string
		for _, st := range v.Statuses {
			for _, l := range st.Limits {
				if !l.Shadow && !l.Decision.Allowed && l.Decision.Limit > 0 {
					violated = append(violated, l.Name)
				}
			}
		}
		l7.WriteProblem(w, l7.Problem{
			Type:             l7.ProblemTypeQuotaExceeded,
			Title:            "Request cannot be satisfied as assigned quota has been exceeded",
			Status:           refuse,
			ViolatedPolicies: violated,
		}, retry)
	})
	return mux
}

// forwardedClient is the rightmost address of the X-Forwarded-For fields
// that is not in trusted.
func forwardedClient(fields []string, trusted []netip.Prefix) (netip.Addr, bool) {
	for i := len(fields) - 1; i >= 0; i-- {
		parts := strings.Split(fields[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			a, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
			if err != nil {
				return netip.Addr{}, false
			}
			a = a.Unmap()
			inTrusted := false
			for _, p := range trusted {
				inTrusted = inTrusted || p.Contains(a)
			}
			if !inTrusted {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

func parseHTTP(r *http.Request, trusted []netip.Prefix) (Request, error) {
	req := Request{Domain: r.PathValue("domain")}
	if v := r.Header.Get(HitsHeader); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return req, errors.Join(ErrInvalid, errors.New(HitsHeader+": want a number"))
		}
		req.HitsAddend = n
	}
	if r.URL.Query().Get("forwarded") == "1" {
		// Traefik's ForwardAuth cannot set a header from the client's
		// address; it sends X-Forwarded-For (replaced by the peer's address
		// unless the peer is one of Traefik's trustedIPs, appended to
		// otherwise). The client is its rightmost address outside
		// l7.trusted_proxies, as for the proxy's ip key.
		a, ok := forwardedClient(r.Header.Values("X-Forwarded-For"), trusted)
		if !ok {
			return req, errors.Join(ErrInvalid, errors.New("forwarded=1 without a client address in X-Forwarded-For"))
		}
		req.Descriptors = append(req.Descriptors, Descriptor{Entries: []Entry{{Key: "remote_address", Value: a.String()}}})
	}
	fields := r.Header.Values(DescriptorHeader)
	if len(fields) > MaxDescriptors {
		return req, errors.Join(ErrInvalid, errors.New("too many descriptors"))
	}
	for _, f := range fields {
		var d Descriptor
		for _, part := range strings.Split(f, ";") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			k, v, ok := strings.Cut(part, "=")
			if !ok {
				return req, errors.Join(ErrInvalid, errors.New(DescriptorHeader+": want key=value; key=value"))
			}
			d.Entries = append(d.Entries, Entry{Key: strings.TrimSpace(k), Value: strings.TrimSpace(v)})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, nil
}
