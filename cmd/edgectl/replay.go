package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/edgeguard/edgeguard/internal/control"
)

// framesRequest reads what `edgectl explain --pcap/--frame` sends: the
// file (bounded before it is read whole), or the frame's hex (spaces,
// colons and a 0x prefix allowed), and a candidate policy.
func framesRequest(pcapFile, frameHex, policyFile string) (control.ExplainFramesRequest, error) {
	var req control.ExplainFramesRequest
	switch {
	case pcapFile != "" && frameHex != "":
		return req, usageError{fmt.Errorf("--pcap or --frame, not both")}
	case pcapFile != "":
		b, err := readBounded(pcapFile, control.MaxReplayFile)
		if err != nil {
			return req, err
		}
		req.Pcap = b
	default:
		h := strings.NewReplacer(" ", "", ":", "", "\n", "", "\t", "").Replace(strings.TrimPrefix(frameHex, "0x"))
		b, err := hex.DecodeString(h)
		if err != nil {
			return req, usageError{fmt.Errorf("bad --frame: %w", err)}
		}
		req.Frame = b
	}
	if policyFile != "" {
		b, err := os.ReadFile(policyFile)
		if err != nil {
			return req, fmt.Errorf("read candidate policy: %w", err)
		}
		req.Policy, req.PolicySource = string(b), policyFile
	}
	return req, nil
}

// readBounded reads a file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read capture file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read capture file: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("capture file %s: more than %d bytes: cut it (tcpdump -r IN -c N -w OUT)", path, limit)
	}
	return b, nil
}

func printFrameReplay(out io.Writer, r control.FrameReplay) {
	policy := fmt.Sprintf("the running policy (generation %d)", r.Generation)
	if r.Policy != "running" {
		policy = "candidate policy " + r.Policy
	}
	fmt.Fprintf(out, "%d frame(s) decided by the reference model with %s, in order on a private copy of the\n"+
		"data plane's state (buckets fill as they would; nothing charged in the data plane), at %s.\n\n",
		len(r.Frames), policy, r.Clock)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "#\tTIME\tSOURCE\tPROTO\tPORTS\tLEN\tVERDICT\tREASON\tRULE\tCAPTURED AS")
	for _, f := range r.Frames {
		src, ports := "-", "-"
		if f.Src != nil {
			src = f.Src.String()
		}
		if f.SPort != 0 || f.DPort != 0 {
			ports = fmt.Sprintf("%d>%d", f.SPort, f.DPort)
		}
		length := fmt.Sprint(f.Len)
		if f.Captured < f.Len {
			length = fmt.Sprintf("%d (%d captured)", f.Len, f.Captured)
		}
		was := "-"
		if f.WasVerdict != "" {
			was = f.WasVerdict + " (" + f.WasReason + ")"
		}
		fmt.Fprintf(w, "%d\t%.6f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.N, f.Offset, src, orDash(f.Proto), ports, length,
			f.Verdict, f.Reason, orDash(f.Rule), was)
	}
	w.Flush()
	fmt.Fprintln(out, "\ntotals:")
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, t := range r.Totals {
		fmt.Fprintf(w, "  %s\t%s\t%d\n", t.Verdict, t.Reason, t.Frames)
	}
	w.Flush()
	if r.Compared > 0 {
		fmt.Fprintf(out, "\n%d of %d frame(s) with a captured verdict get the same verdict and reason now "+
			"(a bucket's verdict may differ: the state is today's, and a capture holds only sampled frames)\n", r.Agreed, r.Compared)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
