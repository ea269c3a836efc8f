package netns

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// MaxBurst bounds every burst a testbed sends: tests stay small and cannot
// turn into a flood by a typo.
const MaxBurst = 10000

// burstSeq tells bursts apart so a late datagram of one burst is never
// counted in the next.
var burstSeq atomic.Uint64

// UDPBurst sends a bounded burst of UDP datagrams and counts how many
// arrive.
type UDPBurst struct {
	From     *net.UDPConn // connected to To's address; source of the burst
	Sentinel *net.UDPConn // connected to To's address from a source the program passes
	To       *net.UDPConn // bound socket on the receiving side
	Count    int          // datagrams in the burst, 1 to MaxBurst
	Payload  int          // extra payload bytes per datagram
	Timeout  time.Duration
}

// Run sends Count datagrams from From, then one sentinel from Sentinel, and
// reads To until the sentinel arrives. The sentinel travels the same veth
// queue and socket after the burst, so when it has arrived every datagram of
// the burst that was going to arrive has: the count needs no sleep. Run
// returns the number of burst datagrams received.
func (b UDPBurst) Run() (int, error) {
	if b.Count < 1 || b.Count > MaxBurst {
		return 0, fmt.Errorf("burst of %d datagrams: want 1 to %d", b.Count, MaxBurst)
	}
	timeout := b.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	seq := strconv.FormatUint(burstSeq.Add(1), 10)
	tag := []byte("eg-burst-" + seq + "-")
	end := []byte("eg-end-" + seq)
	msg := append(append([]byte{}, tag...), make([]byte, b.Payload)...)
	for i := 0; i < b.Count; i++ {
		if _, err := b.From.Write(msg); err != nil {
			return 0, fmt.Errorf("send datagram %d of %d: %w", i+1, b.Count, err)
		}
	}
	if _, err := b.Sentinel.Write(end); err != nil {
		return 0, fmt.Errorf("send sentinel: %w", err)
	}
	if err := b.To.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	defer b.To.SetReadDeadline(time.Time{})
	buf := make([]byte, 64*1024)
	got := 0
	for {
		n, err := b.To.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got, fmt.Errorf("sentinel not received within %v (%d of %d burst datagrams arrived): "+
				"is the sentinel's source passed by the program?", timeout, got, b.Count)
		}
		if err != nil {
			return got, fmt.Errorf("read: %w", err)
		}
		switch {
		case bytes.Equal(buf[:n], end):
			return got, nil
		case bytes.HasPrefix(buf[:n], tag):
			got++
		}
	}
}
