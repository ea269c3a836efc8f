package l7

import (
	"net/http"
	"strconv"
	"unicode/utf8"
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
	var stack [512]byte
	body := p.AppendJSON(stack[:0])
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

// AppendJSON appends p as JSON, byte for byte what json.Marshal(p) writes
// (checked by FuzzProblemJSON), without reflection: a 429's body is built
// on every rejection.
func (p Problem) AppendJSON(b []byte) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	if p.Detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, p.Detail)
	}
	if len(p.ViolatedPolicies) > 0 {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range p.ViolatedPolicies {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString quotes s as encoding/json does by default: HTML-safe
// (<, >, & escaped), U+2028 and U+2029 escaped, invalid UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
