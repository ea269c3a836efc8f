package accesslog

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

func entry(method, host, path, peer string) Entry {
	return Entry{Time: time.Unix(1700000000, 123456789), Route: "api", Decision: "limited", Limit: "per-ip",
		Status: 429, Total: 1500 * time.Microsecond, Upstream: 250 * time.Microsecond, Forwarded: true,
		Request: &http.Request{Method: method, Host: host, URL: &url.URL{Path: path, RawQuery: "token=secret"}, RemoteAddr: peer}}
}

// TestAppendJSONHostile: request strings with quotes, control bytes,
// invalid UTF-8, line separators and huge lengths still make one valid
// JSON line, with the values escaped, not dropped or reinterpreted.
func TestAppendJSONHostile(t *testing.T) {
	long := strings.Repeat("é", 3000) // 6000 bytes, cut at a rune boundary
	for _, c := range []struct{ name, path, wantPath string }{
		{"plain", "/v1/items", "/v1/items"},
		{"quote and backslash", `/a"b\c`, `/a"b\c`},
		{"newline and CR", "/a\nb\r\n{\"x\":1}", "/a\nb\r\n{\"x\":1}"},
		{"control and DEL", "/\x00\x01\x1f\x7f", "/\x00\x01\x1f\x7f"},
		{"invalid utf-8", "/\xff\xfe\xc3", "/\ufffd\ufffd\ufffd"},
		{"line separators", "/\u2028\u2029", "/\u2028\u2029"},
		{"long", long, long[:maxField]},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := AppendJSON(nil, entry("GET", "h\"ost", c.path, "198.18.0.1:1"))
			if !strings.HasSuffix(string(b), "}\n") || strings.Count(string(b), "\n") != 1 {
				t.Fatalf("not one line: %q", b)
			}
			for _, r := range string(b[:len(b)-1]) {
				if r < 0x20 || r == '\u2028' || r == '\u2029' {
					t.Fatalf("raw control or separator %U in %q", r, b)
				}
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("invalid JSON %q: %v", b, err)
			}
			if m["path"] != c.wantPath {
				t.Errorf("path %q, want %q", m["path"], c.wantPath)
			}
			if m["host"] != `h"ost` || m["status"] != 429.0 || m["limit"] != "per-ip" || m["duration_ms"] != 1.5 || m["upstream_ms"] != 0.25 {
				t.Errorf("fields: %v", m)
			}
			if strings.Contains(string(b), "secret") {
				t.Errorf("the query reached the log: %q", b)
			}
		})
	}
}

func FuzzAppendJSON(f *testing.F) {
	f.Add("GET", "a.example", "/x", "1.2.3.4:5")
	f.Add("\x00", "\xff", "\u2028\"\\", "")
	f.Fuzz(func(t *testing.T, method, host, path, peer string) {
		b := AppendJSON(nil, entry(method, host, path, peer))
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("invalid JSON %q: %v", b, err)
		}
		if strings.Count(string(b), "\n") != 1 {
			t.Fatalf("not one line: %q", b)
		}
		want := path
		if len(want) > maxField {
			want = want[:maxField]
			for len(want) > 0 && !utf8.RuneStart(path[len(want)]) {
				want = want[:len(want)-1]
			}
		}
		if utf8.ValidString(want) && m["path"] != want {
			t.Fatalf("path %q, want %q", m["path"], want)
		}
	})
}

// TestReopen: after a rename, Reopen sends the next lines to a new file at
// the path; the renamed file keeps the earlier ones.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(entry("GET", "a", "/before", "p"))
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	l.Log(entry("GET", "a", "/after", "p"))
	l.Close()
	for file, want := range map[string]string{path + ".1": "/before", path: "/after"} {
		lines := readLines(t, file)
		if len(lines) != 1 || !strings.Contains(lines[0], `"path":"`+want+`"`) {
			t.Errorf("%s: %q, want one line for %s", file, lines, want)
		}
	}
	if st := l.Stats(); st.Lines != 2 || st.Reopens != 1 || st.Dropped != 0 {
		t.Errorf("stats %+v", st)
	}
	if err := l.Reopen(); err == nil {
		t.Error("Reopen after Close succeeded")
	}
}

// TestNeverBlocks: with the file stuck (a FIFO nobody reads), Log keeps
// returning: the buffer fills to its bound and later lines are dropped and
// counted. (A Log that waited for the file would hang the test.)
func TestNeverBlocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	line := len(AppendJSON(nil, entry("GET", "a", "/x", "p")))
	n := 3 * MaxBuffer / line // three buffers' worth, beside the pipe's own 64 KiB
	for range n {
		l.Log(entry("GET", "a", "/x", "p"))
	}
	st := l.Stats()
	if st.Dropped == 0 || st.Lines+st.Dropped != int64(n) {
		t.Fatalf("stats %+v after %d lines into a stuck file: want some dropped, all counted", st, n)
	}
	// Let the writer finish so Close returns.
	if err := syscall.SetNonblock(int(r.Fd()), false); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, r)
	l.Close()
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// TestAppendJSONClass: the class a request was charged as is written when
// known, and left out otherwise.
func TestAppendJSONClass(t *testing.T) {
	e := entry("GET", "h", "/", "198.18.0.1:1")
	if b := string(AppendJSON(nil, e)); strings.Contains(b, `"class"`) {
		t.Errorf("no class, yet %q", b)
	}
	e.Class = "over_usual"
	if b := string(AppendJSON(nil, e)); !strings.Contains(b, `"limit":"per-ip","class":"over_usual","status":429`) {
		t.Errorf("class missing or misplaced: %q", b)
	}
}
