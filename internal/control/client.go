package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
)

// ErrNotRunning means nothing listens on the control socket.
var ErrNotRunning = errors.New("edgeguard daemon is not running")

// ErrPermission means the caller may not use the control socket.
var ErrPermission = errors.New("permission denied")

// APIError is an error answer from the daemon.
type APIError struct {
	Status   int
	Message  string
	Problems []string
}

func (e *APIError) Error() string {
	if len(e.Problems) == 0 {
		return e.Message
	}
	s := e.Message
	for _, p := range e.Problems {
		s += "\n  " + p
	}
	return s
}

// Client talks to the daemon over its Unix socket.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{socket: path, http: &http.Client{Transport: tr}}
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	u := "http://edgeguard" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		switch {
		case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Errorf("%w: no daemon at %s (start one with 'edgectl run --config FILE')", ErrNotRunning, c.socket)
		case errors.Is(err, os.ErrPermission):
			return fmt.Errorf("%w: %s is root-only: run edgectl with sudo", ErrPermission, c.socket)
		}
		return fmt.Errorf("talk to daemon at %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read daemon answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("daemon answered %s", resp.Status)
		}
		ae := &APIError{Status: resp.StatusCode, Message: e.Error, Problems: e.Problems}
		if resp.StatusCode == http.StatusForbidden {
			return fmt.Errorf("%w: %w", ErrPermission, ae)
		}
		return ae
	}
	if out == nil || len(data) == 0 {
		return nil // 204 No Content
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode daemon answer: %w", err)
	}
	return nil
}

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.do(ctx, http.MethodGet, "/v1/status", nil, nil, &s)
}

// Stats returns totals and rates.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	return s, c.do(ctx, http.MethodGet, "/v1/stats", nil, nil, &s)
}

// Top returns the top dropped talkers over the last window.
func (c *Client) Top(ctx context.Context, window Duration, n int) (Top, error) {
	var t Top
	q := url.Values{"window": {window.String()}, "n": {fmt.Sprint(n)}}
	return t, c.do(ctx, http.MethodGet, "/v1/top", q, nil, &t)
}

func (d Duration) String() string { b, _ := d.MarshalText(); return string(b) }

// Policy returns the running policy's text.
func (c *Client) Policy(ctx context.Context) (PolicyDoc, error) {
	var p PolicyDoc
	return p, c.do(ctx, http.MethodGet, "/v1/policy", nil, nil, &p)
}

// DiffPolicy compares a candidate policy with the running one.
func (c *Client) DiffPolicy(ctx context.Context, doc PolicyDoc) (PolicyChange, error) {
	var p PolicyChange
	return p, c.do(ctx, http.MethodPost, "/v1/policy/diff", nil, doc, &p)
}

// ApplyPolicy validates and applies a policy, and makes it the daemon's
// configuration file.
func (c *Client) ApplyPolicy(ctx context.Context, doc PolicyDoc) (PolicyChange, error) {
	var p PolicyChange
	return p, c.do(ctx, http.MethodPost, "/v1/policy", nil, doc, &p)
}

// List returns a list's entries.
func (c *Client) List(ctx context.Context, kind ListKind) ([]ListEntry, error) {
	var l []ListEntry
	return l, c.do(ctx, http.MethodGet, "/v1/lists/"+string(kind), nil, nil, &l)
}

// AddToList adds or refreshes an entry.
func (c *Client) AddToList(ctx context.Context, kind ListKind, ch ListChange) (ListEntry, error) {
	var e ListEntry
	return e, c.do(ctx, http.MethodPost, "/v1/lists/"+string(kind), nil, ch, &e)
}

// RemoveFromList removes an entry added at run time.
// The answer's NotSaved says when the removal is not saved.
func (c *Client) RemoveFromList(ctx context.Context, kind ListKind, p string) (ListEntry, error) {
	var e ListEntry
	return e, c.do(ctx, http.MethodDelete, "/v1/lists/"+string(kind), url.Values{"prefix": {p}}, nil, &e)
}
