// Package sockdiag asks the kernel (NETLINK_SOCK_DIAG, inet_diag) which
// sockets listen, by protocol: the SYN path needs to know whether a
// protected service's listener is MPTCP, whose first SYN-ACK the data
// plane's cookies cannot stand in for.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// inetDiagReqProtocol is INET_DIAG_REQ_PROTOCOL (linux/inet_diag.h): a
// request attribute carrying a protocol number that does not fit the
// request's 8-bit field, as IPPROTO_MPTCP (262) does not.
const inetDiagReqProtocol = 3

// tcpListen is TCP_LISTEN, the state MPTCP listeners report too.
const tcpListen = 10

// MPTCPListeners returns the address and port of every MPTCP socket
// listening in the caller's network namespace (IPv4 and IPv6; :: and
// 0.0.0.0 for a wildcard bind). A kernel without MPTCP diagnostics
// (mptcp_diag) answers with an error, returned as is.
func MPTCPListeners() ([]netip.AddrPort, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag bind: %w", err)
	}
	var out []netip.AddrPort
	for seq, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		got, err := dump(fd, uint32(seq+1), family)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func dump(fd int, seq uint32, family uint8) ([]netip.AddrPort, error) {
	// nlmsghdr (16) + inet_diag_req_v2 (56) + nlattr u32 (8).
	msg := make([]byte, 16+56+8)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(msg[8:], seq)
	req := msg[16:]
	req[0] = family
	req[1] = uint8(unix.IPPROTO_MPTCP & 0xff) // the attribute below carries the real number
	ne.PutUint32(req[4:], 1<<tcpListen)
	// inet_diag_sockid's cookie: INET_DIAG_NOCOOKIE.
	ne.PutUint32(req[8+40:], ^uint32(0))
	ne.PutUint32(req[8+44:], ^uint32(0))
	attr := msg[16+56:]
	ne.PutUint16(attr[0:], 8)
	ne.PutUint16(attr[2:], inetDiagReqProtocol)
	ne.PutUint32(attr[4:], unix.IPPROTO_MPTCP)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag request: %w", err)
	}
	var out []netip.AddrPort
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("sock_diag answer: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(ne.Uint32(m.Data)); errno != 0 {
						return nil, fmt.Errorf("sock_diag MPTCP dump (is mptcp_diag available?): %w", unix.Errno(-errno))
					}
				}
				return out, nil
			}
			ap, err := listener(m.Data)
			if err != nil {
				return nil, err
			}
			out = append(out, ap)
		}
	}
}

// listener reads an inet_diag_msg's local address and port.
func listener(b []byte) (netip.AddrPort, error) {
	if len(b) < 4+48 {
		return netip.AddrPort{}, errors.New("sock_diag: short inet_diag_msg")
	}
	port := binary.BigEndian.Uint16(b[4:])
	var addr netip.Addr
	switch b[0] {
	case unix.AF_INET:
		addr = netip.AddrFrom4([4]byte(b[8:12]))
	case unix.AF_INET6:
		addr = netip.AddrFrom16([16]byte(b[8:24])).Unmap()
	default:
		return netip.AddrPort{}, fmt.Errorf("sock_diag: family %d", b[0])
	}
	return netip.AddrPortFrom(addr, port), nil
}
