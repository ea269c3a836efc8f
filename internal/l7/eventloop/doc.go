// Package eventloop serves HTTP/1.1 on a listener and forwards what its
// handler lets through to one plain-HTTP upstream, from one epoll loop per
// core: the reverse-proxy engine of internal/l7/proxy on Linux.
//
// Each loop runs on its own locked OS thread with its own epoll set; it
// accepts connections from the shared listener, reads requests, runs the
// handler (the limits) and relays the request to an upstream connection of
// its own pool and the response back, reading each socket once per
// readiness. A handler whose decision may block (a Redis round trip, a
// concurrency queue) calls Go to make it on a goroutine; the loop goes on
// with other connections and resumes this one when the handler is done.
//
// The handler is an http.Handler: it writes a response (a 429, a 503) or
// calls Forward to have the request proxied, with whatever header fields it
// set (RateLimit, RateLimit-Policy) added to the upstream's response.
//
// What it relays: request and response bodies framed by Content-Length or
// chunked (forwarded unchanged, trailers included) and close-delimited
// responses; pipelined requests (answered in order); 1xx interim
// responses; upgrades (101, then bytes both ways). Hop-by-hop fields are
// dropped; X-Forwarded-For/-Host/-Proto are set like httputil.ReverseProxy's
// SetXForwarded. docs/l7-proxy.md ("Engines") lists the rules and limits.
package eventloop
