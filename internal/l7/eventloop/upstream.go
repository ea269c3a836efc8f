package eventloop

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// upConn is a connection to the upstream, owned by one loop: serving one
// client connection's request, or idle in the loop's pool.
type upConn struct {
	l   *loop
	fd  int
	in  ioBuf
	out outBuf
	readiness
	connecting bool  // a non-blocking connect is under way
	deadline   int64 // the connect's deadline
	client     *conn // nil while idle
	reused     bool  // taken from the pool (may have been closed under us)
	gotBytes   bool  // a response head came on it for the current request
	sent       bool  // bytes of the current request went out on it
	closed     bool
	idleSince  int64
	// addr is the index of the address dialled; connectFailed: the
	// connect itself failed (nothing was sent), so the next address may be
	// tried.
	addr          int
	connectFailed bool
}

func (u *upConn) event(ev uint32) {
	u.note(ev)
	if u.client != nil {
		u.client.step()
		return
	}
	if u.readable {
		// An idle connection has nothing to say: the upstream closed it
		// (or broke the protocol).
		u.l.dropIdle(u)
		u.closeFD()
	}
}

// flush finishes a connect and writes what is queued, once.
func (u *upConn) flush() (bool, error) {
	if u.connecting {
		if !u.writable {
			return false, nil
		}
		soerr, err := unix.GetsockoptInt(u.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && soerr != 0 {
			err = unix.Errno(soerr)
		}
		if err != nil {
			u.connectFailed = true
			return false, fmt.Errorf("connect to the upstream: %w", err)
		}
		u.connecting = false
	}
	if !u.writable {
		return false, nil
	}
	wrote, full, err := u.out.flushTo(u.l, u.fd)
	if err != nil {
		return false, fmt.Errorf("write to the upstream: %w", err)
	}
	u.sent = u.sent || wrote
	if full {
		u.writable = false
	}
	return wrote, nil
}

// read reads once from the upstream.
func (u *upConn) read() (n int, eof bool, err error) {
	n, drained, eof, err := u.in.readFrom(u.l, u.fd, maxHead+1)
	if drained && !u.peerClosed {
		u.readable = false
	}
	if err != nil {
		return 0, false, fmt.Errorf("read from the upstream: %w", err)
	}
	return n, eof, nil
}

func (u *upConn) closeFD() {
	if u.closed {
		return
	}
	u.closed = true
	u.l.forget(u.fd)
	u.in.release(u.l)
	u.out.release(u.l)
}

// upstream returns an idle pooled connection, or dials a new one.
func (l *loop) upstream() (*upConn, error) {
	for n := len(l.idle); n > 0; n = len(l.idle) {
		u := l.idle[n-1]
		l.idle[n-1] = nil
		l.idle = l.idle[:n-1]
		if u.readable {
			// Bytes or an end on an idle connection make it unusable;
			// EAGAIN means the flag was stale.
			var b [1]byte
			if _, err := unix.Read(u.fd, b[:]); !errors.Is(err, unix.EAGAIN) {
				u.closeFD()
				continue
			}
			u.readable = false
		}
		u.reused, u.gotBytes = true, false
		return u, nil
	}
	return l.dial(0)
}

// dial starts a non-blocking connect to the upstream's addresses from
// index from on, in order (as net.Dialer does): an address that refuses at
// once is skipped here, one that fails later is left by the caller
// (upConn.addr, connectFailed).
func (l *loop) dial(from int) (*upConn, error) {
	addrs := l.s.upstreamAddrs()
	if len(addrs) == 0 {
		return nil, errors.New("the upstream's address is not resolved")
	}
	var err error
	for i := from; i < len(addrs); i++ {
		var u *upConn
		if u, err = l.dialAddr(addrs[i]); err == nil {
			u.addr = i
			return u, nil
		}
	}
	return nil, err
}

func (l *loop) dialAddr(addr netip.AddrPort) (*upConn, error) {
	var sa unix.Sockaddr
	family := unix.AF_INET
	if addr.Addr().Is4() {
		sa = &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Addr: addr.Addr().As16(), Port: int(addr.Port())}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("upstream socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	u := &upConn{l: l, fd: fd, deadline: l.now + int64(l.s.cfg.DialTimeout)}
	err = unix.Connect(fd, sa)
	switch {
	case err == nil:
		u.writable = true
	case errors.Is(err, unix.EINPROGRESS):
		u.connecting = true
	default:
		unix.Close(fd)
		return nil, fmt.Errorf("connect to the upstream %s: %w", addr, err)
	}
	if err := l.register(fd, u); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("epoll add upstream: %w", err)
	}
	return u, nil
}

// release puts a connection that ended a request cleanly back in the pool;
// past the pool's bound the oldest idle one is closed.
func (l *loop) release(u *upConn) {
	if l.draining {
		u.closeFD()
		return
	}
	u.in.release(l)
	u.out.release(l)
	u.idleSince = l.now
	if len(l.idle) >= l.maxIdle {
		l.idle[0].closeFD()
		copy(l.idle, l.idle[1:])
		l.idle = l.idle[:len(l.idle)-1]
	}
	l.idle = append(l.idle, u)
}

// dropIdle removes u from the pool (it was closed by the upstream).
func (l *loop) dropIdle(u *upConn) {
	for i, x := range l.idle {
		if x == u {
			copy(l.idle[i:], l.idle[i+1:])
			l.idle[len(l.idle)-1] = nil
			l.idle = l.idle[:len(l.idle)-1]
			return
		}
	}
}
