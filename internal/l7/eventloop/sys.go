package eventloop

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loops' system calls on non-blocking sockets, and epoll_wait with a
// zero timeout, never block: they are made as raw system calls, without
// the runtime's entersyscall/exitsyscall hand-off (the thread keeps its P;
// the loop's goroutine is locked to it anyway). Only epoll_wait that may
// sleep goes through unix.EpollWait. Sockets are read with recvfrom and
// written with sendto (MSG_NOSIGNAL), which skip the VFS layer (file
// position lock, fsnotify) that read and write go through.

func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// pollNow is epoll_wait with a zero timeout.
func pollNow(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
