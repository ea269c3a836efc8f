package eventloop_test

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAbandonedRelayHoldsTheHandler: a client that leaves while the
// upstream works on its request does not end the relay: Relay.Forward
// (and so the concurrency slot a handler holds across it) returns only
// once the upstream has answered, and the answer is read to its end.
func TestAbandonedRelayHoldsTheHandler(t *testing.T) {
	entered, answer, answered := make(chan struct{}, 1), make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	release := func() { once.Do(func() { close(answer) }) }
	up := startHTTPUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-answer // deaf: the proxy's close does not stop it
		_, _ = io.WriteString(w, "done")
		answered <- struct{}{}
	}))
	t.Cleanup(release) // (before the upstream's Close, which waits for its handler)
	returned := make(chan struct{}, 1)
	cfg := proxyConfig(t, up.URL)
	cfg.Handler = serveWith(func(*http.Request) bool { return true }, func(_ http.ResponseWriter, _ *http.Request, forward func()) {
		forward()
		returned <- struct{}{}
	})
	addr := startEngine(t, cfg)
	c, _ := dial(t, addr)
	write(t, c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	_ = c.Close()
	select {
	case <-returned:
		t.Fatal("Relay.Forward returned when the client left, while the upstream still worked")
	case <-time.After(500 * time.Millisecond):
	}
	release()
	<-answered
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Relay.Forward did not return after the upstream answered")
	}
}
