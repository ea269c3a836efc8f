package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"syscall"
	"time"
)

// CaptureRequest asks the daemon for a stream of sampled frames
// (POST /v1/capture; docs/operations.md, "Capture").
type CaptureRequest struct {
	// Which: "dropped" (the default), "passed" or "all".
	Which string `json:"which,omitempty"`
	// Reasons keeps only frames of these verdict reasons (names as in
	// edgectl stats); empty: every reason.
	Reasons []string `json:"reasons,omitempty"`
	// Filter is the tcpdump expression, for the record; Program is what
	// it compiled to (classic BPF, Ethernet link type, as tcpdump -ddd
	// prints it: code, jt, jf, k), run on each frame's sampled bytes.
	// Empty: every frame.
	Filter  string      `json:"filter,omitempty"`
	Program [][4]uint32 `json:"program,omitempty"`
	// SnapLen cuts each frame's bytes to at most this many (0: all the
	// sample carries).
	SnapLen int `json:"snaplen,omitempty"`
}

// MaxCaptureProgram bounds a capture filter's instructions (the kernel's
// classic BPF bound, BPF_MAXINSNS).
const MaxCaptureProgram = 4096

// CaptureEvent is one line of the capture stream (JSON lines): the start,
// then frames, with Lost set on any line after frames were lost.
type CaptureEvent struct {
	Start *CaptureStart `json:"start,omitempty"`
	Frame *CaptureFrame `json:"frame,omitempty"`
	// Lost is how many matching frames the daemon could not queue for
	// this stream so far (the stream's reader was slower than the
	// samples); it only grows.
	Lost uint64 `json:"lost,omitempty"`
	// End is the last line's: why the daemon ended the stream.
	End string `json:"end,omitempty"`
}

// CaptureStart says what the stream holds.
type CaptureStart struct {
	// SnapLen is how many of each frame's first bytes the data plane's
	// samples carry (EG_SNAP_LEN).
	SnapLen int `json:"snaplen"`
	// DropBudget is the drop samples' budget per second (0: drop
	// samples off); OneIn and MaxPerSecond the 1-in-N sampler's (OneIn
	// 0: off).
	DropBudget   uint64   `json:"drop_samples_per_second"`
	OneIn        uint32   `json:"one_in"`
	MaxPerSecond uint64   `json:"max_per_second"`
	Interfaces   []string `json:"interfaces,omitempty"`
}

// CaptureFrame is one sampled frame and its verdict.
type CaptureFrame struct {
	Time time.Time `json:"time"`
	// Sampler: "drop" (a drop sample) or "1-in-N" (with Weight: the
	// packets it stands for).
	Sampler string `json:"sampler"`
	Weight  uint32 `json:"weight,omitempty"`
	Action  string `json:"action"`
	Reason  string `json:"reason"`
	Rule    string `json:"rule,omitempty"`
	// Class is the source's standing class where an aggregate refused the
	// packet ("unknown": not looked up); Refused the outcome there, and
	// RefusedBy that aggregate's kind (prefix, asn, global), which an
	// override's reason (shield_tighten, ...) does not name.
	Class     string `json:"class"`
	Refused   string `json:"refused,omitempty"`
	RefusedBy string `json:"refused_by,omitempty"`
	// Len is the frame's length on the wire; Data its first bytes.
	Len  int    `json:"len"`
	Data []byte `json:"data"`
}

// maxCaptureLine bounds one line of the stream (a frame is a few hundred
// bytes of JSON).
const maxCaptureLine = 1 << 20

// Capture opens the capture stream and calls each for every event until
// the stream ends (nil), ctx ends (nil), each returns an error, or the
// daemon fails.
func (c *Client) Capture(ctx context.Context, req CaptureRequest, each func(CaptureEvent) error) error {
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode capture request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://edgeguard/v1/capture", bytes.NewReader(b))
	if err != nil {
		return err
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Errorf("%w: no daemon at %s (start one with 'edgectl run --config FILE')", ErrNotRunning, c.socket)
		case errors.Is(err, os.ErrPermission):
			return fmt.Errorf("%w: %s is root-only: run edgectl with sudo", ErrPermission, c.socket)
		}
		return fmt.Errorf("talk to daemon at %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxCaptureLine))
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
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxCaptureLine)
	for sc.Scan() {
		var ev CaptureEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("decode capture stream: %w", err)
		}
		if err := each(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("read capture stream: %w", err)
	}
	return nil
}
