package l7

import (
	"net/http"
	"net/textproto"
)

// TierByHeader selects the tier named by a header's value (set by a
// trusted auth layer in front of the middleware).
func TierByHeader(name string) func(*http.Request) string {
	name = textproto.CanonicalMIMEHeaderKey(name)
	return func(r *http.Request) string {
		if v := r.Header[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
}
