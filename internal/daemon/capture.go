package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/capture"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Capture (docs/operations.md, "Capture"): the sample readers hand every
// sample with its frame bytes to the capture hub, which queues the ones
// each open capture selects and its filter matches; the capture's handler
// streams them to edgectl as JSON lines. A capture whose reader falls
// behind loses frames (counted, and reported in the stream), never slows
// the sample readers.

// Bounds of the capture streams.
const (
	maxCaptures      = 8
	captureQueue     = 4096 // frames queued per capture
	maxCaptureBody   = 512 << 10
	captureHeartbeat = 5 * time.Second // an empty line at least this often: a dead client is noticed
)

// capturedFrame is a queued frame: its sample and a copy of its bytes.
type capturedFrame struct {
	s    maps.Sample
	at   time.Time
	n    int
	data [maps.SnapLen]byte
}

type captureSub struct {
	sel   capture.Selection
	match *capture.Matcher
	ch    chan *capturedFrame
	lost  atomic.Uint64
}

// captureHub is the capture subsystem: the open captures, the frames the
// sample readers offer them, and the streams to edgectl. It follows the
// committed generation (its sampling settings and rule names, for the
// stream's start and its frames' rule names); it writes no map.
type captureHub struct {
	log *slog.Logger
	// gens reads the live rule slots; nil before the data plane loads
	// (nothing to capture).
	gens *maps.Generations
	// ifaces are the interfaces attached now (the daemon's, under its mu).
	ifaces func() []string

	genMu sync.Mutex // guards gen and names; a leaf
	gen   *policy.Compiled
	names map[uint32]string // gen's rule id -> name

	active atomic.Int32 // subscribers: the readers' fast path when 0
	// Frames streamed and lost (a full queue), all captures together.
	sent, lost atomic.Uint64
	mu         sync.Mutex
	subs       map[*captureSub]struct{}
	closed     chan struct{} // closed when the daemon stops
	once       sync.Once
}

func newCaptureHub(log *slog.Logger, ifaces func() []string) *captureHub {
	return &captureHub{log: log, ifaces: ifaces, subs: map[*captureSub]struct{}{}, closed: make(chan struct{})}
}

// follow takes the committed generation's sampling settings and rule
// names. It cannot fail.
func (h *captureHub) follow(_ context.Context, c committed) error {
	h.genMu.Lock()
	defer h.genMu.Unlock()
	h.gen, h.names = c.run.compiled, c.run.names
	return nil
}

func (h *captureHub) subscribe(sub *captureSub) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.closed:
		return errors.New("the daemon is stopping")
	default:
	}
	if len(h.subs) >= maxCaptures {
		return fmt.Errorf("%d captures run already, at most %d", len(h.subs), maxCaptures)
	}
	h.subs[sub] = struct{}{}
	h.active.Store(int32(len(h.subs)))
	return nil
}

func (h *captureHub) unsubscribe(sub *captureSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, sub)
	h.active.Store(int32(len(h.subs)))
}

// close ends every capture stream (the daemon stops).
func (h *captureHub) close() { h.once.Do(func() { close(h.closed) }) }

// publish offers one sample and its frame bytes (valid only during the
// call) to every capture.
func (h *captureHub) publish(s maps.Sample, frame []byte) {
	if h.active.Load() == 0 {
		return
	}
	var at time.Time
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		if !sub.sel.Wants(s) || !sub.match.Match(frame) {
			continue
		}
		if at.IsZero() {
			at = sampleWallTime(s.Time)
		}
		f := &capturedFrame{s: s, at: at}
		f.n = copy(f.data[:], frame)
		select {
		case sub.ch <- f:
		default:
			sub.lost.Add(1)
			h.lost.Add(1)
		}
	}
}

// captureCollectors export the hub's state (docs/metrics.md, "Capture").
func (h *captureHub) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeguard_captures_active",
			Help: "edgectl capture streams open now (at most 8).",
		}, func() float64 { return float64(h.active.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgeguard_capture_frames_sent_total",
			Help: "Sampled frames streamed to edgectl capture, all captures together.",
		}, func() float64 { return float64(h.sent.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgeguard_capture_frames_lost_total",
			Help: "Sampled frames a capture selected and could not queue (its reader was slower than the samples), all captures together.",
		}, func() float64 { return float64(h.lost.Load()) }),
	}
}

// sampleWallTime turns a sample's CLOCK_MONOTONIC time into wall-clock
// time; now when the clock cannot be read or the sample is not from it
// (a test clock).
func sampleWallTime(mono time.Duration) time.Time {
	now := time.Now()
	m, err := maps.MonoNow()
	if err != nil {
		return now
	}
	age := time.Duration(m) - mono
	if age < 0 || age > time.Minute {
		return now
	}
	return now.Add(-age)
}

// serve is POST /v1/capture: it streams the frames a capture
// selects until the client goes, the daemon stops, or the client's
// connection fails.
func (h *captureHub) serve(w http.ResponseWriter, r *http.Request) {
	var req control.CaptureRequest
	if !decodeBody(w, r, maxCaptureBody, "capture request", &req) {
		return
	}
	sel, err := capture.ParseSelection(req.Which, req.Reasons)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	match, err := capture.NewMatcher(req.Program)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if req.SnapLen < 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("snaplen %d: want 0 (all) or more", req.SnapLen))
		return
	}
	snap := maps.SnapLen
	if req.SnapLen > 0 {
		snap = min(snap, req.SnapLen)
	}
	if h.gens == nil {
		writeError(w, http.StatusServiceUnavailable, errors.New("no data plane: nothing to capture"))
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, errors.New("the control socket cannot stream"))
		return
	}
	sub := &captureSub{sel: sel, match: match, ch: make(chan *capturedFrame, captureQueue)}
	if err := h.subscribe(sub); err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	defer h.unsubscribe(sub)
	h.log.Info("capture started", "which", sel.Which, "reasons", req.Reasons, "filter", req.Filter, "snaplen", snap)

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if err := enc.Encode(control.CaptureEvent{Start: h.start()}); err != nil {
		return
	}
	flusher.Flush()
	names := h.slotNames()
	var sent, lost uint64
	defer func() {
		h.log.Info("capture ended", "frames", sent, "lost", lost)
	}()
	beat := time.NewTicker(captureHeartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-h.closed:
			enc.Encode(control.CaptureEvent{Lost: sub.lost.Load(), End: "the daemon is stopping"})
			flusher.Flush()
			return
		case <-beat.C:
			if _, err := w.Write([]byte("{}\n")); err != nil {
				return
			}
			flusher.Flush()
		case f := <-sub.ch:
			// Everything queued now in one write and one flush.
			for f != nil {
				cf := h.frame(f, snap, &names)
				lost = sub.lost.Load()
				if err := enc.Encode(control.CaptureEvent{Frame: cf, Lost: lost}); err != nil {
					return
				}
				sent++
				h.sent.Add(1)
				select {
				case f = <-sub.ch:
				default:
					f = nil
				}
			}
			flusher.Flush()
		}
	}
}

// start describes the samples the stream draws on.
func (h *captureHub) start() *control.CaptureStart {
	st := &control.CaptureStart{SnapLen: maps.SnapLen}
	h.genMu.Lock()
	c := h.gen
	h.genMu.Unlock()
	if c != nil {
		if c.Samples.Rate.Per > 0 {
			st.DropBudget = uint64(float64(c.Samples.Rate.Count) * float64(time.Second) / float64(c.Samples.Rate.Per))
		}
		st.OneIn, st.MaxPerSecond = c.Sampling.OneIn, c.Sampling.MaxPerSecond
	}
	st.Interfaces = h.ifaces()
	slices.Sort(st.Interfaces)
	return st
}

// slotRules names rule slots (samples carry the slot); refreshed when a
// sample names a slot it does not know, at most once a second.
type slotRules struct {
	bySlot map[uint32]string
	read   time.Time
}

func (h *captureHub) slotNames() slotRules {
	out := slotRules{bySlot: map[uint32]string{}, read: time.Now()}
	h.genMu.Lock()
	names := h.names
	h.genMu.Unlock()
	if slots, err := h.gens.RuleSlots(); err == nil {
		for id, slot := range slots {
			out.bySlot[slot] = names[id]
		}
	}
	return out
}

func (h *captureHub) frame(f *capturedFrame, snap int, names *slotRules) *control.CaptureFrame {
	s := f.s
	rule, ok := names.bySlot[s.RuleSlot]
	if !ok && s.HasRule && time.Since(names.read) > time.Second {
		*names = h.slotNames()
		rule, ok = names.bySlot[s.RuleSlot]
	}
	if !ok {
		rule = fmt.Sprintf("slot %d", s.RuleSlot)
	}
	if !s.HasRule { // lists, malformed frames, no policy
		rule = ""
	}
	cf := &control.CaptureFrame{
		Time: f.at, Sampler: "drop", Action: maps.ActionName(s.Action), Reason: maps.ReasonName(s.Reason),
		Rule: rule, Class: maps.ClassName(s.Class), Len: int(s.FrameLen),
		Data: append([]byte(nil), f.data[:min(f.n, snap)]...),
	}
	if s.Kind == maps.SampleRate {
		cf.Sampler, cf.Weight = "1-in-N", s.Weight
	}
	if s.Refused != 0 {
		cf.Refused, cf.RefusedBy = maps.OutcomeName(s.Refused), maps.ClassAggName(s.RefusedAgg)
	}
	cf.Len = cmp.Or(cf.Len, len(cf.Data))
	return cf
}
