package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSynSysctls: the shipped sysctl.d file sets exactly what the daemon
// checks, and the check names every setting that differs.
func TestSynSysctls(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "sysctl.d", "60-edgeguard-syn.conf"))
	if err != nil {
		t.Fatal(err)
	}
	shipped := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		shipped[strings.ReplaceAll(strings.TrimSpace(k), ".", "/")] = strings.TrimSpace(v)
	}
	if len(shipped) != len(synSysctls) {
		t.Errorf("shipped %v, checked %v", shipped, synSysctls)
	}
	for _, s := range synSysctls {
		if shipped[s.key] != s.want {
			t.Errorf("%s: shipped %q, checked %q", s.key, shipped[s.key], s.want)
		}
	}
	fake := func(vals map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			v, ok := vals[strings.TrimPrefix(p, "/proc/sys/")]
			if !ok {
				return nil, errors.New("no such file")
			}
			return []byte(v + "\n"), nil
		}
	}
	good := map[string]string{}
	for k, v := range shipped {
		good[k] = v
	}
	if bad := checkSynSysctls(fake(good)); len(bad) != 0 {
		t.Errorf("all set: %v", bad)
	}
	good["net/ipv4/tcp_syncookies"] = "2"
	delete(good, "net/ipv4/tcp_sack")
	bad := checkSynSysctls(fake(good))
	if len(bad) != 2 || !strings.Contains(bad[0], "net.ipv4.tcp_syncookies=2 (want 1)") || !strings.Contains(bad[1], "tcp_sack=unreadable") {
		t.Errorf("check = %v", bad)
	}
}
