package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/capture"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// errCaptureDone ends a capture that reached its count.
var errCaptureDone = errors.New("capture count reached")

func newCaptureCommand() *cobra.Command {
	var dropped, passed, all bool
	var reasons []string
	var file string
	var count, seconds, snaplen int
	cmd := &cobra.Command{
		Use:   "capture [--dropped|--passed|--all] [--reason R] [-c COUNT] [-G SECONDS] [--snaplen N] -w FILE [FILTER]",
		Short: "Write sampled frames, with their verdicts, to a pcapng file",
		Long: fmt.Sprintf(`Write frames the data plane sampled to FILE as pcapng (tcpdump -r and Wireshark read it; -w -
writes to stdout), each with its verdict, reason, rule, standing class and sampler in the frame's
comment. The frames are samples, not every packet: --dropped (the default) takes the drop samples
(at most 1,000 per second) and the 1-in-N samples of deny-list drops; --passed the 1-in-N samples
of passed packets (policy sampling:); --all both. Each frame carries its first %d bytes at most.

FILTER is a tcpdump expression ('udp and dst port 53'), compiled by tcpdump (it must be
installed) and run on each frame's sampled bytes in the daemon: a filter that looks past them
matches nothing. The capture stops after -c COUNT frames, after -G SECONDS (as tcpdump -G
SECONDS -W 1: no rotation), or on Ctrl-C, whichever comes first; without -c and -G it runs until
interrupted.`, maps.SnapLen),
		Example: `  edgectl capture -c 100 -w drops.pcapng
  edgectl capture --reason source_limit -G 30 -w limited.pcapng 'udp and dst port 53'
  edgectl capture --all -c 1000 -w - | tcpdump -nr -`,
	}
	cmd.Flags().BoolVar(&dropped, "dropped", false, "dropped and would-drop frames (the default)")
	cmd.Flags().BoolVar(&passed, "passed", false, "passed frames (1-in-N samples)")
	cmd.Flags().BoolVar(&all, "all", false, "dropped and passed frames")
	cmd.MarkFlagsMutuallyExclusive("dropped", "passed", "all")
	cmd.Flags().StringSliceVar(&reasons, "reason", nil, "only frames of this verdict reason (as in edgectl stats; repeatable)")
	cmd.Flags().StringVarP(&file, "write", "w", "", "the pcapng file to write (- for stdout)")
	cmd.Flags().IntVarP(&count, "count", "c", 0, "stop after this many frames (0: no limit)")
	cmd.Flags().IntVarP(&seconds, "seconds", "G", 0, "stop after this many seconds (0: no limit)")
	cmd.Flags().IntVarP(&snaplen, "snaplen", "s", 0, fmt.Sprintf("bytes of each frame to write, at most %d (0: all the sample has)", maps.SnapLen))
	cmd.MarkFlagRequired("write")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		which := capture.Dropped
		switch {
		case passed:
			which = capture.Passed
		case all:
			which = capture.All
		}
		switch {
		case count < 0:
			return usageError{fmt.Errorf("-c %d: want 0 (no limit) or more", count)}
		case seconds < 0:
			return usageError{fmt.Errorf("-G %d: want 0 (no limit) or more", seconds)}
		case snaplen < 0 || snaplen > maps.SnapLen:
			return usageError{fmt.Errorf("--snaplen %d: want 0 to %d (the bytes the data plane samples)", snaplen, maps.SnapLen)}
		}
		if _, err := capture.ParseSelection(string(which), reasons); err != nil {
			return usageError{err}
		}
		expr := strings.Join(args, " ")
		prog, err := capture.CompileFilter(cmd.Context(), expr)
		if err != nil {
			return usageError{err}
		}
		req := control.CaptureRequest{Which: string(which), Reasons: reasons, Filter: expr, Program: prog, SnapLen: snaplen}
		return runCapture(cmd, req, file, count, time.Duration(seconds)*time.Second)
	}
	return cmd
}

// runCapture streams frames into the file until a bound is reached.
func runCapture(cmd *cobra.Command, req control.CaptureRequest, file string, count int, dur time.Duration) error {
	ctx := cmd.Context()
	if dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, dur)
		defer cancel()
	}
	var out io.Writer = cmd.OutOrStdout()
	var f *os.File
	if file != "-" {
		var err error
		if f, err = os.Create(file); err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	status := cmd.ErrOrStderr()
	var w *capture.Writer
	var written int
	var lost uint64
	var end string
	err := newClient(cmd).Capture(ctx, req, func(ev control.CaptureEvent) error {
		lost = max(lost, ev.Lost)
		switch {
		case ev.Start != nil:
			st := ev.Start
			if st.OneIn == 0 {
				switch req.Which {
				case string(capture.Passed):
					return fmt.Errorf("1-in-N sampling is off (policy sampling.one_in: 0): no passed frames can come")
				case string(capture.All):
					fmt.Fprintln(status, "edgectl: 1-in-N sampling is off (policy sampling.one_in: 0): dropped frames only")
				}
			}
			snap := st.SnapLen
			if req.SnapLen > 0 {
				snap = min(snap, req.SnapLen)
			}
			var err error
			w, err = capture.NewWriter(out, capture.FileInfo{
				Application: "edgectl capture " + buildInfo().Version, Filter: req.Filter, SnapLen: snap,
				Interfaces: st.Interfaces, Comment: captureComment(req, st),
			})
			if err != nil {
				return err
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(status, "edgectl: capturing %s frames from the data plane's samples on %s, %d bytes each at most\n",
				req.Which, strings.Join(st.Interfaces, ","), snap)
		case ev.Frame != nil:
			if w == nil {
				return errors.New("capture stream: a frame before the start")
			}
			if err := w.Write(ev.Frame); err != nil {
				return err
			}
			if err := w.Flush(); err != nil {
				return err
			}
			written++
			if count > 0 && written >= count {
				return errCaptureDone
			}
		case ev.End != "":
			end = ev.End
		}
		return nil
	})
	if errors.Is(err, errCaptureDone) {
		err = nil
	}
	if w != nil {
		if ferr := w.Flush(); ferr != nil && err == nil {
			err = ferr
		}
	}
	if f != nil {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", file, cerr)
		}
		if w == nil {
			os.Remove(file) // not even a header: no file rather than an unreadable one
		}
	}
	summary := fmt.Sprintf("%d frames written", written)
	if lost > 0 {
		summary += fmt.Sprintf(", %d lost (the capture read slower than the samples came)", lost)
	}
	fmt.Fprintf(status, "edgectl: %s\n", summary)
	if err != nil {
		return err
	}
	if end != "" {
		return fmt.Errorf("the daemon ended the capture: %s", end)
	}
	if w == nil && cmd.Context().Err() == nil {
		return errors.New("the daemon closed the capture stream before it started")
	}
	return nil
}

// captureComment is the file's section comment: what it holds.
func captureComment(req control.CaptureRequest, st *control.CaptureStart) string {
	s := fmt.Sprintf("edgectl capture --%s", req.Which)
	for _, r := range req.Reasons {
		s += " --reason " + r
	}
	if req.Filter != "" {
		s += fmt.Sprintf(" filter %q", req.Filter)
	}
	s += fmt.Sprintf(": samples of the Edgeguard XDP program, not every packet (drop samples: at most %d/s; "+
		"1-in-N samples: one_in %d, at most %d/s); each frame's comment holds its verdict", st.DropBudget, st.OneIn, st.MaxPerSecond)
	return s
}
