package control

import (
	"context"
	"net/http"
	"net/netip"
)

// Bounds of `edgectl explain --pcap`: the capture file's size (the
// request carries it base64-encoded, so the request bound is 4/3 of it
// plus room for a policy) and how many frames one request decides.
const (
	MaxReplayFile   = 32 << 20
	MaxReplayFrames = 100_000
)

// ExplainFramesRequest asks the daemon to decide frames with the
// reference model on a private copy of the live state: the frames of a
// pcap or pcapng file (Pcap), or one frame (Frame). Policy, when set, is
// a candidate policy's text, applied to the copy instead of the running
// generation (what-if); PolicySource names it.
type ExplainFramesRequest struct {
	Pcap         []byte `json:"pcap,omitempty"`
	Frame        []byte `json:"frame,omitempty"`
	Policy       string `json:"policy,omitempty"`
	PolicySource string `json:"policy_source,omitempty"`
}

// FrameReplay is the model's verdict on each frame, in file order, each
// decided after the ones before it on one private copy of the data
// plane's state (buckets fill as they would), and the totals.
type FrameReplay struct {
	// Generation is the running generation the copy was read with;
	// Policy says which policy decided: "running" or the candidate's
	// source (what-if).
	Generation uint64 `json:"generation"`
	Policy     string `json:"policy"`
	// Clock says at what time each frame was decided.
	Clock  string         `json:"clock"`
	Frames []FrameVerdict `json:"frames"`
	Totals []VerdictTotal `json:"totals"`
	// Compared counts frames whose capture comment records a verdict
	// (edgectl capture), Agreed those the model gave the same verdict and
	// reason.
	Compared int `json:"compared"`
	Agreed   int `json:"agreed"`
}

// FrameVerdict is one frame's verdict.
type FrameVerdict struct {
	N int `json:"n"` // 1-based, in file order
	// Offset is the seconds after the first frame it was decided at.
	Offset float64 `json:"offset"`
	// Src, Proto and the ports as the model's parser read them (Src is
	// absent for a frame that is not IP or not parsed that far).
	Src   *netip.Addr `json:"src,omitempty"`
	Proto string      `json:"proto,omitempty"`
	SPort uint16      `json:"sport,omitempty"`
	DPort uint16      `json:"dport,omitempty"`
	// Len is the frame's length, Captured the bytes the file holds.
	Len      int `json:"len"`
	Captured int `json:"captured"`
	// Verdict is pass, drop, would_drop, or undecided (the decision
	// depends on bytes the file does not hold: reason snap_length).
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	Rule    string `json:"rule,omitempty"` // the rule it was counted under
	// Captured verdict and reason from the frame's comment, if any.
	WasVerdict string `json:"was_verdict,omitempty"`
	WasReason  string `json:"was_reason,omitempty"`
}

// VerdictTotal counts the frames of one verdict and reason.
type VerdictTotal struct {
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	Frames  int    `json:"frames"`
}

// ExplainFrames asks the daemon to decide frames (edgectl explain --pcap,
// --frame).
func (c *Client) ExplainFrames(ctx context.Context, req ExplainFramesRequest) (FrameReplay, error) {
	var r FrameReplay
	return r, c.do(ctx, http.MethodPost, "/v1/explain/frames", nil, req, &r)
}
