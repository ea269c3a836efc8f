// Package accesslog writes the L7 stage's access log: one JSON object per
// request, one per line, to stderr or to a file that SIGUSR1 reopens (for
// logrotate's rename-then-signal). Logging never blocks a request: lines
// go into a bounded buffer that a goroutine of its own writes out; a line
// that finds the buffer full is dropped and counted. See docs/l7-proxy.md,
// "Access log".
package accesslog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Stderr is the path that names the process's standard error.
const Stderr = "stderr"

// MaxBuffer bounds the bytes of lines waiting to be written; lines that
// do not fit are dropped (Stats.Dropped).
const MaxBuffer = 1 << 20

// flushEvery is the longest a line waits in the buffer.
const flushEvery = 200 * time.Millisecond

// maxField bounds each string taken from a request (path, host, method):
// longer values are cut, so one line stays under about 10 KiB whatever the
// request.
const maxField = 2048

// Entry is one request's line.
type Entry struct {
	Time time.Time
	// Request gives the method, path (without the query: queries often
	// carry credentials), host and peer address.
	Request   *http.Request
	Route     string
	Decision  string
	Limit     string
	Status    int
	Total     time.Duration
	Upstream  time.Duration
	Forwarded bool
	// Class is the client's class (internal/l7/class; "" when the
	// request was not classified: exempt, or no ranking).
	Class string
}

// Stats are the log's counters.
type Stats struct {
	Lines, Dropped, WriteErrors, Reopens int64
}

// Log is an access log. Log and Reopen are safe for concurrent use.
type Log struct {
	path string

	mu      sync.Mutex
	buf     []byte
	closing bool

	wake    chan struct{}
	reopen  chan chan error
	stopped chan struct{}
	cancel  context.CancelFunc

	lines, dropped, writeErrors, reopens atomic.Int64
}

// Open opens path (Stderr, or a file created mode 0640 and appended to)
// and starts the writer. Close stops it.
func Open(path string) (*Log, error) {
	w, err := openPath(path)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Log{path: path, wake: make(chan struct{}, 1), reopen: make(chan chan error), stopped: make(chan struct{}),
		cancel: cancel, buf: make([]byte, 0, 64<<10)}
	go l.run(ctx, w)
	return l, nil
}

func openPath(path string) (io.WriteCloser, error) {
	if path == Stderr {
		return nopCloser{os.Stderr}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("access log: %w", err)
	}
	return f, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// Path is what the log writes to.
func (l *Log) Path() string { return l.path }

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	return Stats{Lines: l.lines.Load(), Dropped: l.dropped.Load(), WriteErrors: l.writeErrors.Load(), Reopens: l.reopens.Load()}
}

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// Log queues e's line; it never waits for the file.
func (l *Log) Log(e Entry) {
	bp := lineBufs.Get().(*[]byte)
	line := AppendJSON((*bp)[:0], e)
	l.mu.Lock()
	ok := !l.closing && len(l.buf)+len(line) <= MaxBuffer
	if ok {
		l.buf = append(l.buf, line...)
	}
	l.mu.Unlock()
	*bp = line
	lineBufs.Put(bp)
	if !ok {
		l.dropped.Add(1)
		return
	}
	l.lines.Add(1)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Reopen closes and opens the file again (after logrotate renamed it),
// once what is buffered is written to the old one. For Stderr it only
// flushes.
func (l *Log) Reopen() error {
	ch := make(chan error, 1)
	select {
	case l.reopen <- ch:
		return <-ch
	case <-l.stopped:
		return errors.New("access log: closed")
	}
}

// Close writes what is buffered and closes the file.
func (l *Log) Close() {
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
	l.cancel()
	<-l.stopped
}

// run owns the file: it writes the buffer out (never holding the lock
// across the write) until Close.
func (l *Log) run(ctx context.Context, w io.WriteCloser) {
	defer close(l.stopped)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	spare := make([]byte, 0, 64<<10)
	flush := func() {
		l.mu.Lock()
		out := l.buf
		l.buf = spare[:0]
		l.mu.Unlock()
		if len(out) > 0 {
			if _, err := w.Write(out); err != nil {
				l.writeErrors.Add(1)
			}
		}
		spare = out
	}
	for {
		select {
		case <-ctx.Done():
			flush()
			_ = w.Close()
			return
		case ch := <-l.reopen:
			flush()
			if l.path == Stderr {
				ch <- nil
				continue
			}
			nw, err := openPath(l.path)
			if err != nil {
				// Keep writing to the old file: a line is better lost to
				// a renamed file than not written at all.
				ch <- err
				continue
			}
			_ = w.Close()
			w = nw
			l.reopens.Add(1)
			ch <- nil
		case <-l.wake:
			// Gather a batch: write once the buffer holds a few lines or
			// the ticker fires, not once per line.
			l.mu.Lock()
			n := len(l.buf)
			l.mu.Unlock()
			if n >= 32<<10 {
				flush()
			}
		case <-t.C:
			flush()
		}
	}
}

// AppendJSON appends e's line (a JSON object and a newline) to b. Every
// string is escaped (control bytes, quotes, invalid UTF-8 as U+FFFD) and
// cut at maxField bytes.
func AppendJSON(b []byte, e Entry) []byte {
	b = append(b, `{"time":"`...)
	b = e.Time.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, `","route":`...)
	b = appendString(b, e.Route)
	b = append(b, `,"decision":`...)
	b = appendString(b, e.Decision)
	if e.Limit != "" {
		b = append(b, `,"limit":`...)
		b = appendString(b, e.Limit)
	}
	if e.Class != "" {
		b = append(b, `,"class":`...)
		b = appendString(b, e.Class)
	}
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	b = append(b, `,"duration_ms":`...)
	b = strconv.AppendFloat(b, float64(e.Total)/1e6, 'f', 3, 64)
	if e.Forwarded {
		b = append(b, `,"upstream_ms":`...)
		b = strconv.AppendFloat(b, float64(e.Upstream)/1e6, 'f', 3, 64)
	}
	if r := e.Request; r != nil {
		b = append(b, `,"method":`...)
		b = appendString(b, r.Method)
		b = append(b, `,"host":`...)
		b = appendString(b, r.Host)
		b = append(b, `,"path":`...)
		path := ""
		if r.URL != nil {
			path = r.URL.Path
		}
		b = appendString(b, path)
		b = append(b, `,"peer":`...)
		b = appendString(b, r.RemoteAddr)
	}
	return append(b, "}\n"...)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, cut at maxField bytes (at a
// rune boundary).
func appendString(b []byte, s string) []byte {
	if len(s) > maxField {
		cut := maxField
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, `\u202`...)
			b = append(b, hexDigits[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
