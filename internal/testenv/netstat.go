package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// TCPExt reads the TcpExt counter name (SyncookiesSent, ...) of the
// network namespace the calling thread is in: call it inside the
// namespace's Do.
func TCPExt(name string) (uint64, error) {
	f, err := os.Open("/proc/thread-self/net/netstat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var keys []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "TcpExt:" {
			continue
		}
		if keys == nil {
			keys = fields
			continue
		}
		i := slices.Index(keys, name)
		if i < 0 {
			return 0, fmt.Errorf("no %s in netstat", name)
		}
		return strconv.ParseUint(fields[i], 10, 64)
	}
	return 0, errors.New("no TcpExt values in netstat")
}
