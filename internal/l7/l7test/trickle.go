package l7test

import (
	"io"
	"sync"
	"time"
)

// Trickle writes one byte to w every period, as a slow client sends a
// body, until stop is called or a write fails (the server cut the
// connection).
func Trickle(w io.Writer, every time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(every):
				if _, err := w.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}
