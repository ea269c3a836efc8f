package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a log destination safe for concurrent writers (a
// limiter's probe or sync goroutines) and a test reading it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
