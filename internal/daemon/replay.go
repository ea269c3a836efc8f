package daemon

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/edgeguard/edgeguard/internal/capture"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// `edgectl explain --pcap FILE | --frame HEX [--policy FILE]`: the
// reference model's verdict on captured frames, replayed in order on a
// private copy of the live state (docs/operations.md, "Explain a captured
// frame").

// maxFramesBody bounds a request: a capture file of at most
// control.MaxReplayFile bytes, base64 in JSON, and a policy.
const maxFramesBody = control.MaxReplayFile/3*4 + maxPolicyBody + 4<<10

// errReplayInput marks a request the daemon refuses for what it holds
// (a file it cannot read, a policy that does not validate): 4xx, not 5xx.
var errReplayInput = errors.New("bad replay request")

func (d *Daemon) replayRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/explain/frames", func(w http.ResponseWriter, r *http.Request) {
		var req control.ExplainFramesRequest
		if !decodeBody(w, r, maxFramesBody, "explain frames request", &req) {
			return
		}
		out, err := d.ExplainFrames(context.WithoutCancel(r.Context()), req)
		if err != nil {
			status := http.StatusInternalServerError
			var ve *policy.ValidationError
			if errors.Is(err, errReplayInput) || errors.As(err, &ve) {
				status = http.StatusUnprocessableEntity
			}
			writeError(w, status, err)
			return
		}
		writeJSON(w, out)
	})
}

// replayFrames are the frames a request names: a file's, or one.
func replayFrames(req control.ExplainFramesRequest) ([]capture.Frame, error) {
	switch {
	case len(req.Pcap) > 0 && len(req.Frame) > 0:
		return nil, fmt.Errorf("%w: a file or a frame, not both", errReplayInput)
	case len(req.Frame) > 0:
		if len(req.Frame) > capture.MaxFrameLen {
			return nil, fmt.Errorf("%w: frame of %d bytes: at most %d", errReplayInput, len(req.Frame), capture.MaxFrameLen)
		}
		return []capture.Frame{{Data: req.Frame, Len: len(req.Frame)}}, nil
	case len(req.Pcap) > control.MaxReplayFile:
		return nil, fmt.Errorf("%w: capture file of %d bytes: at most %d", errReplayInput, len(req.Pcap), control.MaxReplayFile)
	case len(req.Pcap) > 0:
		fs, err := capture.ReadFrames(req.Pcap, control.MaxReplayFrames)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errReplayInput, err)
		}
		return fs, nil
	}
	return nil, fmt.Errorf("%w: no frames: give a capture file or a frame", errReplayInput)
}

// ExplainFrames decides each frame with the reference model, in order,
// on one private copy of the data plane's state read now (maps.ReadState,
// refmodel.FromState, as Explain): every frame charges the copy's
// buckets, so later frames meet what earlier ones left. Frame i is decided
// at the data plane's clock now plus its capture time after the first
// frame's (a frame without a time, or earlier than the one before it, at
// the previous frame's time). Nothing in the data plane is charged.
//
// A frame cut short by the capture (fewer bytes than its length) is
// decided as its length with the missing bytes zero, if the parser reads
// the same packet when they are all ones instead; if not, the decision
// depends on bytes the file does not hold and the frame is undecided.
//
// With a candidate policy, it is validated and compiled as `policy diff`
// does, and applied to the copy (refmodel's Apply and SetLists, with the
// run-time list entries) before the first frame: buckets and overrides
// stay, as an apply keeps them.
func (d *Daemon) ExplainFrames(ctx context.Context, req control.ExplainFramesRequest) (control.FrameReplay, error) {
	frames, err := replayFrames(req)
	if err != nil {
		return control.FrameReplay{}, err
	}
	var cand *running
	if req.Policy != "" {
		src := cmp.Or(req.PolicySource, "candidate policy")
		d.changeMu.Lock()
		next, err := d.prepare(ctx, []byte(req.Policy), src)
		d.changeMu.Unlock()
		if err != nil {
			return control.FrameReplay{}, err
		}
		cand = &next
	}
	model, st, out, names, err := d.replayModel(cand)
	if err != nil {
		return control.FrameReplay{}, err
	}
	out.Frames = make([]control.FrameVerdict, 0, len(frames))
	// The frames are decided without the daemon's lock (a file of many
	// frames takes a while): the model holds its copy, and the large
	// tables it looks up as it goes are the kernel's maps, read as the
	// program runs (an error reading one is the answer's, LiveErr).
	totals := map[[2]string]int{}
	var first, last time.Time
	var offset time.Duration
	for i, f := range frames {
		if !f.Time.IsZero() {
			if first.IsZero() {
				first = f.Time
			}
			if f.Time.After(last) {
				offset, last = f.Time.Sub(first), f.Time
			}
		}
		fv := replayFrame(model, f, st.NowNS+uint64(offset), names)
		fv.N, fv.Offset = i+1, offset.Seconds()
		if v, r, ok := capture.CommentVerdict(f.Comment); ok {
			fv.WasVerdict, fv.WasReason = v, r
			out.Compared++
			if v == fv.Verdict && r == fv.Reason {
				out.Agreed++
			}
		}
		totals[[2]string{fv.Verdict, fv.Reason}]++
		out.Frames = append(out.Frames, fv)
	}
	if err := model.LiveErr(); err != nil {
		return control.FrameReplay{}, fmt.Errorf("explain frames: read the data plane's tables: %w", err)
	}
	for k, n := range totals {
		out.Totals = append(out.Totals, control.VerdictTotal{Verdict: k[0], Reason: k[1], Frames: n})
	}
	slices.SortFunc(out.Totals, func(a, b control.VerdictTotal) int {
		return cmp.Or(cmp.Compare(b.Frames, a.Frames), cmp.Compare(a.Verdict, b.Verdict), cmp.Compare(a.Reason, b.Reason))
	})
	return out, nil
}

// ReasonSnapLength is the reason of an undecided frame: the decision
// reads bytes past those the capture kept.
const ReasonSnapLength = "snap_length"

// replayFrame decides one frame at nowNS on the model (which it charges).
func replayFrame(m *refmodel.Model, f capture.Frame, nowNS uint64, names map[uint32]string) control.FrameVerdict {
	fv := control.FrameVerdict{Len: f.Len, Captured: len(f.Data)}
	frame := f.Data
	if f.Len > len(f.Data) {
		frame = append(bytes.Clone(f.Data), make([]byte, f.Len-len(f.Data))...)
		ones := append(bytes.Clone(f.Data), bytes.Repeat([]byte{0xff}, f.Len-len(f.Data))...)
		p0, r0 := refmodel.Parse(frame)
		p1, r1 := refmodel.Parse(ones)
		if p0 != p1 || r0 != r1 {
			fv.Verdict, fv.Reason = "undecided", ReasonSnapLength
			return fv
		}
	}
	pi, r := refmodel.Parse(frame)
	if r == maps.ReasonOK || pi.Addr != ([16]byte{}) {
		a := netip.AddrFrom16(pi.Addr).Unmap()
		fv.Src = &a
		if pi.Proto != 0 || r == maps.ReasonOK {
			fv.Proto = protoName(pi.Proto)
		}
		if pi.HasL4 {
			fv.SPort, fv.DPort = pi.SrcPort, pi.DstPort
		}
	}
	v := m.Run(frame, nowNS)
	fv.Verdict, fv.Reason = maps.ActionName(v.Action), maps.ReasonName(v.Reason)
	if v.Counted {
		fv.Rule = names[v.RuleID]
	}
	return fv
}

// replayModel reads the live state into a model (the daemon's lock held
// only to copy the generation, names and lists) and applies a candidate policy to it (nil: the running one); names are
// the deciding policy's rule names.
func (d *Daemon) replayModel(cand *running) (*refmodel.Model, *maps.State, control.FrameReplay, map[uint32]string, error) {
	for attempt := 0; ; attempt++ {
		// d.mu is held only to copy what the replay needs of the daemon
		// (as Explain does), never across the map reads; a state read
		// while the generation was replaced is read again (at most twice
		// more), so the names and the maps are of one generation.
		d.mu.Lock()
		gen, names := d.generation, d.cur.names
		var lists []maps.ListEntry
		var listErr error
		if cand != nil {
			lists, listErr = d.fittingLists(*cand)
		}
		d.mu.Unlock()
		out := control.FrameReplay{Generation: gen, Policy: "running",
			Clock: "the data plane's clock now, plus each frame's capture time after the first frame's"}
		if listErr != nil {
			return nil, nil, out, nil, fmt.Errorf("%w: %w", errReplayInput, listErr)
		}
		st, err := d.m.ReadState()
		if err != nil {
			return nil, nil, out, nil, err
		}
		d.mu.Lock()
		same := d.generation == gen
		d.mu.Unlock()
		if !same && attempt < 2 {
			continue
		}
		model, err := refmodel.FromState(st)
		if err != nil {
			return nil, nil, out, nil, fmt.Errorf("explain frames: %w", err)
		}
		if cand != nil {
			if err := model.Apply(cand.compiled); err != nil {
				return nil, nil, out, nil, fmt.Errorf("%w: candidate policy: %w", errReplayInput, err)
			}
			if err := model.SetLists(lists); err != nil {
				return nil, nil, out, nil, fmt.Errorf("%w: candidate policy's lists: %w", errReplayInput, err)
			}
			out.Policy, names = cand.source, cand.names
		}
		return model, st, out, names, nil
	}
}
