package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

type ifStats struct{ rxPackets, rxDropped uint64 }

// linkStats reads the flood interface's counters. On veth, rx_packets
// counts every frame its NAPI consumed (with or without XDP) and
// rx_dropped includes frames the sender could not queue because the
// receive ring was full.
func linkStats(e *edge) (ifStats, error) {
	l, err := e.ns.Netlink().LinkByName(e.floodIf.Name)
	if err != nil {
		return ifStats{}, fmt.Errorf("read stats of %s: %w", e.floodIf.Name, err)
	}
	s := l.Attrs().Statistics
	return ifStats{rxPackets: s.RxPackets, rxDropped: s.RxDropped}, nil
}

// udpDelivered is InDatagrams + InErrors of the edge namespace's UDP MIB:
// every datagram the stack handed to UDP (delivered, or dropped at a full
// socket buffer).
func udpDelivered(e *edge) (uint64, error) {
	var n uint64
	err := e.ns.Do(func() error {
		vs, err := testenv.NetCounters("snmp", "Udp", "InDatagrams", "InErrors")
		if err == nil {
			n = vs[0] + vs[1]
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("read udp mib in %s: %w", e.ns.Name, err)
	}
	return n, nil
}

// napiThread finds the threaded-NAPI kthread of iface ("napi/<iface>-<id>");
// the newest if several exist.
func napiThread(iface string) (int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return 0, err
	}
	best := 0
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(string(b)), "napi/"+iface+"-") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
			best = max(best, pid)
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("no napi/%s-* kthread: is threaded NAPI on and NAPI enabled?", iface)
	}
	return best, nil
}

// threadByName finds a kernel thread by its exact name.
func threadByName(name string) (int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		if b, err := os.ReadFile(d); err == nil && strings.TrimSpace(string(b)) == name {
			return strconv.Atoi(filepath.Base(filepath.Dir(d)))
		}
	}
	return 0, fmt.Errorf("no thread named %s", name)
}

// cpuNS is a thread's time on CPU in nanoseconds (/proc/PID/schedstat;
// pid -1: the calling thread).
func cpuNS(pid int) (uint64, error) {
	path := fmt.Sprintf("/proc/%d/schedstat", pid)
	if pid == -1 {
		path = "/proc/thread-self/schedstat"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read schedstat of %d: %w", pid, err)
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("schedstat of %d: empty", pid)
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// pin restricts a thread (0: the calling one) to one CPU.
func pin(tid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(tid, &set); err != nil {
		return fmt.Errorf("pin thread %d to cpu %d: %w", tid, cpu, err)
	}
	return nil
}
