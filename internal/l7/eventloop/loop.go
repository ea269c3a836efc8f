package eventloop

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// loop is one event loop: an epoll set on a locked OS thread, the
// connections it accepted and the upstream connections they use. Every
// field but the post queue is touched only by the loop's goroutine.
type loop struct {
	s     *Server
	id    int
	epfd  int
	evfd  int // eventfd: wakes the loop for posted work
	lfd   int // the shared listener (-1 once the loop stops accepting)
	peers []*loop

	mu     sync.Mutex
	posted []func()
	work   []func() // the batch being run (reused)

	// byFD finds the connection of an epoll event (fds are small ints).
	// byFDGen[fd] is the generation fd was registered with, which its
	// events carry: an event harvested before its fd was closed and reused
	// within one batch belongs to the old connection, and is dropped.
	byFD     []pollable
	byFDGen  []int32
	gen      int32
	conns    map[*conn]struct{}
	idle     []*upConn // idle upstream connections, most recent last
	maxIdle  int
	bufs     [][]byte // free read/write buffers of bufSize
	start    time.Time
	now      int64 // nanoseconds since start, at the last wake-up
	lastTick int64
	date     []byte // "Date: ...\r\n", refreshed every second
	draining bool
	done     bool
	err      error
	// acceptPaused: the listener is out of this loop's epoll set until
	// acceptResume (loop time), after accept4 ran out of file descriptors;
	// acceptBackoff is the next pause (5ms doubling to 1s, as net/http's
	// Serve; reset by an accepted connection).
	acceptPaused  bool
	acceptResume  int64
	acceptBackoff time.Duration
}

// pollable is what an epoll event's fd belongs to.
type pollable interface {
	event(ev uint32)
}

func newLoop(s *Server, id, lfd int, peers []*loop) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventloop: epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventloop: eventfd: %w", err)
	}
	l := &loop{s: s, id: id, epfd: epfd, evfd: evfd, lfd: lfd, peers: peers,
		conns: map[*conn]struct{}{}, start: time.Now()}
	l.maxIdle = max(1, s.cfg.MaxIdleUpstream/s.cfg.Loops)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		l.closeFDs()
		return nil, fmt.Errorf("eventloop: epoll add eventfd: %w", err)
	}
	// EPOLLEXCLUSIVE: a new connection wakes one loop, not all.
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, lfd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(lfd)}); err != nil {
		l.closeFDs()
		return nil, fmt.Errorf("eventloop: epoll add listener: %w", err)
	}
	l.refreshDate()
	return l, nil
}

func (l *loop) closeFDs() {
	unix.Close(l.epfd)
	unix.Close(l.evfd)
}

// post runs f on the loop (from any goroutine). Work posted after the loop
// ended is dropped.
func (l *loop) post(f func()) {
	l.mu.Lock()
	l.posted = append(l.posted, f)
	first := len(l.posted) == 1
	l.mu.Unlock()
	if first {
		var one = [8]byte{1}
		_, _ = unix.Write(l.evfd, one[:])
	}
}

func (l *loop) runPosted() {
	var b [8]byte
	_, _ = unix.Read(l.evfd, b[:])
	l.mu.Lock()
	l.work, l.posted = l.posted, l.work[:0]
	l.mu.Unlock()
	for i, f := range l.work {
		f()
		l.work[i] = nil
	}
}

func (l *loop) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	events := make([]unix.EpollEvent, 256)
	for !l.done {
		// Poll first: under load there is always something ready, and a
		// raw zero-timeout poll costs no runtime hand-off; sleep only when
		// nothing is.
		n, err := pollNow(l.epfd, events)
		if err == nil && n == 0 {
			n, err = unix.EpollWait(l.epfd, events, l.pollTimeout())
		}
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			l.err = fmt.Errorf("eventloop: epoll_wait: %w", err)
			l.closeAll()
			return
		}
		l.now = int64(time.Since(l.start))
		if l.acceptPaused && l.now >= l.acceptResume {
			l.resumeAccept()
		}
		for i := range n {
			ev := &events[i]
			fd := int(ev.Fd)
			switch {
			case fd == l.evfd:
				l.runPosted()
			case fd == l.lfd:
				l.accept()
			case fd < len(l.byFD) && l.byFD[fd] != nil && l.byFDGen[fd] == ev.Pad:
				l.byFD[fd].event(ev.Events)
			}
		}
		if l.now-l.lastTick >= int64(time.Second) {
			l.lastTick = l.now
			l.refreshDate()
			l.sweep()
		}
		if l.draining && len(l.conns) == 0 {
			l.done = true
		}
	}
	for _, u := range l.idle {
		u.closeFD()
	}
	l.idle = nil
}

// register adds fd to the loop's epoll set, edge-triggered: the loop keeps
// its own readable/writable flags and reads until a short read.
func (l *loop) register(fd int, p pollable) error {
	l.gen++
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd), Pad: l.gen}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return err
	}
	for fd >= len(l.byFD) {
		l.byFD = append(l.byFD, nil)
		l.byFDGen = append(l.byFDGen, 0)
	}
	l.byFD[fd], l.byFDGen[fd] = p, l.gen
	return nil
}

// forget removes fd from the loop and closes it.
func (l *loop) forget(fd int) {
	if fd < len(l.byFD) {
		l.byFD[fd] = nil
	}
	unix.Close(fd) // closing removes it from the epoll set
}

// pollTimeout is how long epoll_wait may sleep, in milliseconds: a second
// (the sweep's tick), or less when a paused listener is due back.
func (l *loop) pollTimeout() int {
	ms := 1000
	if l.acceptPaused {
		ms = min(ms, max(1, int((l.acceptResume-int64(time.Since(l.start))+int64(time.Millisecond)-1)/int64(time.Millisecond))))
	}
	return ms
}

// accept takes up to 16 new connections per wake-up and deals them to the
// loops in turn.
func (l *loop) accept() {
	for range 16 {
		fd, sa, err := unix.Accept4(l.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			switch {
			case errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE),
				errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.ENOMEM):
				l.pauseAccept(err)
			case !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.ECONNABORTED) && !errors.Is(err, unix.EINTR):
				l.s.log.Debug("l7 event loop: accept", "err", err)
			}
			return
		}
		l.acceptBackoff = 0
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		peer := sockaddrAddrPort(sa)
		target := l.peers[l.s.next.Add(1)%uint64(len(l.peers))]
		if target == l {
			l.adopt(fd, peer)
			continue
		}
		target.post(func() { target.adopt(fd, peer) })
	}
}

// pauseAccept takes the listener out of the loop's epoll set for a while:
// out of file descriptors (or socket memory), accept4 fails at once while
// the connection waits in the backlog, and the level-triggered listener
// would wake the loop again straight away (a core spent spinning). The
// pending connections wait in the listen backlog meanwhile.
func (l *loop) pauseAccept(err error) {
	if l.lfd < 0 || l.acceptPaused {
		return
	}
	if l.acceptBackoff == 0 {
		l.acceptBackoff = 5 * time.Millisecond
	} else {
		l.acceptBackoff = min(2*l.acceptBackoff, time.Second)
	}
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, l.lfd, nil)
	l.acceptPaused = true
	l.acceptResume = l.now + int64(l.acceptBackoff)
	if f := l.s.cfg.AcceptPaused; f != nil {
		f(err)
	}
	l.s.log.Warn("l7 event loop: accept failed; pausing", "err", err, "pause", l.acceptBackoff)
}

// resumeAccept puts the listener back after a pause.
func (l *loop) resumeAccept() {
	l.acceptPaused = false
	if l.lfd < 0 || l.draining {
		return
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.lfd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(l.lfd)}); err != nil {
		l.err = fmt.Errorf("eventloop: epoll add listener: %w", err)
		l.closeAll()
	}
}

func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// adopt starts serving an accepted connection on this loop.
func (l *loop) adopt(fd int, peer netip.AddrPort) {
	if l.draining {
		unix.Close(fd)
		return
	}
	c := newConn(l, fd, peer)
	if err := l.register(fd, c); err != nil {
		l.s.log.Debug("l7 event loop: epoll add", "err", err)
		unix.Close(fd)
		return
	}
	l.conns[c] = struct{}{}
	// A new connection is not a kept-alive one waiting for its next
	// request: as under net/http, its first head must come within
	// ReadHeaderTimeout (a silent connection is not held for IdleTimeout).
	c.deadline = l.now + int64(l.s.cfg.ReadHeaderTimeout)
}

// sweep closes connections past their deadlines: a head not read in
// ReadHeaderTimeout, a kept-alive connection idle past IdleTimeout, a
// request body or a response slower than MinRate over a period (see
// bodyOverdue, responseOverdue), an upstream connect past
// DialTimeout, an idle upstream connection past 90s.
func (l *loop) sweep() {
	for c := range l.conns {
		if c.up != nil && c.up.connecting && l.now > c.up.deadline {
			c.up.connectFailed = true
			c.upstreamFailed(errors.New("connect to the upstream timed out"))
			c.step()
			continue
		}
		if c.deadline > 0 && l.now > c.deadline {
			c.close()
			continue
		}
		switch {
		case c.bodyOverdue():
			l.s.log.Debug("l7 event loop: request body too slow", "peer", c.remoteAddr)
			c.failRequestBody(http.StatusRequestTimeout)
			c.step()
		case c.responseOverdue():
			l.s.log.Debug("l7 event loop: client too slow to take its response", "peer", c.remoteAddr)
			c.close()
		}
	}
	kept := l.idle[:0]
	for _, u := range l.idle {
		if l.now-u.idleSince > int64(upstreamIdleTimeout) {
			u.closeFD()
			continue
		}
		kept = append(kept, u)
	}
	clear(l.idle[len(kept):])
	l.idle = kept
}

// drain stops accepting, closes the connections waiting for a request and
// lets the others finish their request (they close after it).
func (l *loop) drain() {
	if l.draining {
		return
	}
	l.draining = true
	if l.lfd >= 0 {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, l.lfd, nil)
		l.lfd = -1
	}
	for c := range l.conns {
		c.closeAfter = true
		if (c.state == stateHead && c.buffered() == 0 && c.out.pending() == 0) || c.abandoned {
			// (An abandoned exchange is waited for only to hold its
			// concurrency slot, which a stopping engine gives up.)
			c.close()
		}
	}
	if len(l.conns) == 0 {
		l.done = true
	}
}

// closeAll closes every connection at once (the end of a shutdown that
// timed out, or a failed loop).
func (l *loop) closeAll() {
	l.draining = true
	if l.lfd >= 0 {
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, l.lfd, nil)
		l.lfd = -1
	}
	for c := range l.conns {
		c.close()
	}
	l.done = true
}

func (l *loop) refreshDate() {
	l.date = append(l.date[:0], "Date: "...)
	l.date = time.Now().UTC().AppendFormat(l.date, http.TimeFormat)
	l.date = append(l.date, "\r\n"...)
}

// getBuf returns an empty buffer of bufSize capacity.
func (l *loop) getBuf() []byte {
	if n := len(l.bufs); n > 0 {
		b := l.bufs[n-1]
		l.bufs[n-1] = nil
		l.bufs = l.bufs[:n-1]
		return b
	}
	return make([]byte, 0, bufSize)
}

// putBuf keeps b for reuse when it has the standard size (bounded: 64
// per loop).
func (l *loop) putBuf(b []byte) {
	if cap(b) == bufSize && len(l.bufs) < 64 {
		l.bufs = append(l.bufs, b[:0])
	}
}
