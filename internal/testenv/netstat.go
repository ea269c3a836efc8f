package testenv

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// NetCounters reads the counters names of group ("TcpExt" in "netstat",
// "Udp" in "snmp") from one reading of /proc/thread-self/net/file: the
// network namespace the calling thread is in (call it inside the
// namespace's Do).
func NetCounters(file, group string, names ...string) ([]uint64, error) {
	f, err := os.Open("/proc/thread-self/net/" + file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var keys []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != group+":" {
			continue
		}
		if keys == nil {
			keys = fields
			continue
		}
		out := make([]uint64, len(names))
		for j, name := range names {
			i := slices.Index(keys, name)
			if i < 0 {
				return nil, fmt.Errorf("no %s in %s", name, file)
			}
			if out[j], err = strconv.ParseUint(fields[i], 10, 64); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no %s values in %s", group, file)
}
