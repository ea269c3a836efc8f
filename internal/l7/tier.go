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

// TierByKey selects the tier by looking up a header's value (an API key)
// in tiers, a map from key to tier name copied at the call. Unknown keys get
// "" (the default tier).
func TierByKey(header string, tiers map[string]string) func(*http.Request) string {
	header = textproto.CanonicalMIMEHeaderKey(header)
	lookup := make(map[string]string, len(tiers))
	for k, v := range tiers {
		lookup[k] = v
	}
	return func(r *http.Request) string {
		if v := r.Header[header]; len(v) > 0 {
			return lookup[v[0]]
		}
		return ""
	}
}
