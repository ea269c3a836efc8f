package daemon

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/capture"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// TestCaptureRequestValidation: a capture request is checked before
// anything streams: unknown words, reasons and hostile filter programs
// are refused with 400 and say why.
func TestCaptureRequestValidation(t *testing.T) {
	h := newCaptureHub(slog.New(slog.NewTextHandler(io.Discard, nil)), func() []string { return nil })
	for name, tc := range map[string]struct {
		body string
		want string
	}{
		"not json":        {`{`, "decode capture request"},
		"which":           {`{"which":"some"}`, "want dropped, passed or all"},
		"reason":          {`{"reasons":["source-limit"]}`, "source_limit"},
		"jump past end":   {`{"program":[[21,5,0,53],[6,0,0,65535]]}`, "jumping past program bounds"},
		"no return":       {`{"program":[[40,0,0,12]]}`, "must end with"},
		"field too wide":  {`{"program":[[65542,0,0,0]]}`, "out of range"},
		"negative snap":   {`{"snaplen":-1}`, "snaplen -1"},
		"no data plane":   {`{}`, "no data plane"},
		"too big program": {`{"program":[` + strings.Repeat(`[6,0,0,1],`, control.MaxCaptureProgram) + `[6,0,0,1]]}`, "at most 4096"},
	} {
		rec := httptest.NewRecorder()
		h.serve(rec, httptest.NewRequest(http.MethodPost, "/v1/capture", strings.NewReader(tc.body)))
		var e control.Error
		json.Unmarshal(rec.Body.Bytes(), &e)
		wantStatus := http.StatusBadRequest
		if name == "no data plane" {
			wantStatus = http.StatusServiceUnavailable
		}
		if rec.Code != wantStatus || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s: %d %q, want %d and %q", name, rec.Code, e.Error, wantStatus, tc.want)
		}
	}
}

// TestCaptureHub: each capture gets the samples its selection and filter
// take, with a copy of the frame bytes (the reader's buffer is reused); a
// full queue loses frames, counted, without blocking the reader; at most
// maxCaptures run at once.
func TestCaptureHub(t *testing.T) {
	h := newCaptureHub(slog.New(slog.DiscardHandler), nil)
	drop := maps.Sample{Kind: maps.SampleDrop, Action: maps.ActDrop, Reason: maps.ReasonSrcLimit}
	pass := maps.Sample{Kind: maps.SampleRate, Action: maps.ActPass, Reason: maps.ReasonOK}
	h.publish(drop, []byte{1}) // nobody listens: nothing happens

	dropsSel, _ := capture.ParseSelection("dropped", nil)
	allSel, _ := capture.ParseSelection("all", nil)
	// ldb [0]; jeq #7, match, no match
	m, err := capture.NewMatcher([][4]uint32{{0x30, 0, 0, 0}, {0x15, 0, 1, 7}, {0x06, 0, 0, 0xffff}, {0x06, 0, 0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	drops := &captureSub{sel: dropsSel, ch: make(chan *capturedFrame, 2)}
	sevens := &captureSub{sel: allSel, match: m, ch: make(chan *capturedFrame, 8)}
	for _, s := range []*captureSub{drops, sevens} {
		if err := h.subscribe(s); err != nil {
			t.Fatal(err)
		}
	}
	buf := []byte{7, 2, 3}
	h.publish(drop, buf)
	buf[0] = 9
	h.publish(drop, buf)
	buf[0] = 7
	h.publish(pass, buf)
	h.publish(drop, buf) // drops' queue (2) is full: lost
	if len(drops.ch) != 2 || drops.lost.Load() != 1 {
		t.Fatalf("drops: %d queued, %d lost; want 2 and 1", len(drops.ch), drops.lost.Load())
	}
	if f := <-drops.ch; f.n != 3 || !bytes.Equal(f.data[:f.n], []byte{7, 2, 3}) {
		t.Errorf("first frame %x, want a copy of 070203", f.data[:f.n])
	}
	if len(sevens.ch) != 3 || sevens.lost.Load() != 0 {
		t.Errorf("filtered capture: %d queued, want the three frames starting with 7", len(sevens.ch))
	}
	for len(sevens.ch) > 0 {
		if f := <-sevens.ch; f.data[0] != 7 {
			t.Errorf("filtered capture got %x", f.data[:f.n])
		}
	}
	for range maxCaptures - 2 {
		if err := h.subscribe(&captureSub{sel: allSel, ch: make(chan *capturedFrame, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.subscribe(&captureSub{sel: allSel}); err == nil {
		t.Errorf("capture %d accepted, at most %d", maxCaptures+1, maxCaptures)
	}
	h.unsubscribe(drops)
	if h.active.Load() != maxCaptures-1 {
		t.Errorf("active %d after one left, want %d", h.active.Load(), maxCaptures-1)
	}
	h.close()
	if err := h.subscribe(&captureSub{sel: allSel}); err == nil {
		t.Error("a capture accepted after the daemon stopped")
	}
}
