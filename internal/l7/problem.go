package l7

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemTypeQuotaExceeded is the problem type of a 429 from this package,
// as registered by draft-ietf-httpapi-ratelimit-headers.
const ProblemTypeQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the RateLimit-Policy entries that rejected the
	// request (quota-exceeded only).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// WriteProblem writes p as an application/problem+json response with
// Cache-Control: no-store. retryAfter, when positive, is written as
// Retry-After in whole seconds. Other headers must be set before the call.
func WriteProblem(w http.ResponseWriter, p Problem, retryAfterSeconds int64) {
	body, err := json.Marshal(p)
	if err != nil {
		// Only strings and ints: cannot fail. Keep the status anyway.
		body = nil
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["Cache-Control"] = []string{"no-store"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	if retryAfterSeconds > 0 {
		h["Retry-After"] = []string{strconv.FormatInt(retryAfterSeconds, 10)}
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
