// Package eventloop serves HTTP/1.1 on a listener and forwards what its
// handler lets through to one plain-HTTP upstream, from one epoll loop per
// core: the reverse-proxy engine of internal/l7/proxy on Linux.
//
// Each loop runs on its own locked OS thread with its own epoll set; it
// accepts connections from the shared listener, reads requests, runs the
// handler (the limits) and relays the request to an upstream connection of
// its own pool and the response back, reading each socket once per
// readiness.
//
// The engine asks its Handler for a Decision on each request, on the loop:
// Respond (the handler wrote a 429 or a 503 on the http.ResponseWriter it
// was given), Forward (proxy it, with whatever header fields the handler set,
// RateLimit and RateLimit-Policy, added to the upstream's response), or
// Continue (a decision that may block, a Redis round trip or a concurrency
// queue, runs on a goroutine; the loop goes on with other connections and
// resumes this one when it is done; it answers on the writer or calls
// Relay.Forward, which returns once the response is relayed).
//
// What it relays: request and response bodies framed by Content-Length or
// chunked (forwarded unchanged, trailers included but for the framing,
// routing and forwarding fields) and close-delimited responses; pipelined requests (answered in order); 1xx interim
// responses; upgrades (101, then bytes both ways). Hop-by-hop fields are
// dropped; X-Forwarded-For/-Host/-Proto are set like httputil.ReverseProxy's
// SetXForwarded. docs/l7-proxy.md ("Engines") lists the rules and limits.
package eventloop
