package loader

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
)

// ErrSynUnavailable means this kernel lacks what the SYN path needs; the
// limiter runs without it. The wrapped error says what is missing.
var ErrSynUnavailable = errors.New("syn protection unavailable on this kernel")

// ProbeSyn returns nil when the kernel has what the SYN path needs, else
// ErrSynUnavailable with what is missing: the bpf_sk_assign_tcp_reqsk kfunc
// (Linux 6.9) and tcx (6.6).
func ProbeSyn() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("%w: no kernel BTF (/sys/kernel/btf/vmlinux): %w", ErrSynUnavailable, err)
	}
	var fn *btf.Func
	if err := spec.TypeByName("bpf_sk_assign_tcp_reqsk", &fn); err != nil {
		return fmt.Errorf("%w: the kernel has no bpf_sk_assign_tcp_reqsk kfunc (needs Linux >= 6.9 "+
			"with CONFIG_SYN_COOKIES); SYN floods are left to the limiter and the kernel's own SYN cookies", ErrSynUnavailable)
	}
	return nil
}

// SynOptions configure LoadSyn.
type SynOptions struct {
	// TestClock makes the SYN path read time from syn_test_clock.
	TestClock bool
	Logger    *slog.Logger
}

// SynPath is the loaded SYN path: its maps and programs and its tcx
// links, one per interface. Its XDP program is the datapath's entry: Attach
// attaches it, and it tail-calls the limiter.
type SynPath struct {
	Objects SyncookieObjects
	// TestClock: the programs read time from syn_test_clock.
	TestClock bool
	tcx       map[string]link.Link
	pinDir    string // dp's PinDir/syn, or ""
	log       *slog.Logger
}

// LoadSyn loads the SYN path in front of dp's limiter: from then on,
// dp.Attach attaches the SYN path's XDP program, which hands the limiter
// every packet it does not decide (tail call). On a kernel without what it
// needs it returns ErrSynUnavailable and dp is untouched.
func LoadSyn(dp *Datapath, opts SynOptions) (_ *SynPath, err error) {
	if err := ProbeSyn(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = dp.log
	}
	spec, err := LoadSyncookie()
	if err != nil {
		return nil, fmt.Errorf("parse embedded syn object: %w", err)
	}
	// The limiter's lists, shared: deny-listed sources get no answer. Its
	// standing table, shared: a valid cookie makes its source validated
	// there, and validated sources bypass the SYN path (docs/tcp.md).
	spec.Maps[SyncookieMapLists].MaxEntries = dp.Objects.Lists.MaxEntries()
	spec.Maps[SyncookieMapStanding].MaxEntries = dp.Objects.Standing.MaxEntries()
	if opts.TestClock {
		if err := spec.Variables["eg_syn_test_clock"].Set(uint8(1)); err != nil {
			return nil, fmt.Errorf("set eg_syn_test_clock: %w", err)
		}
	}
	s := &SynPath{tcx: map[string]link.Link{}, log: log, TestClock: opts.TestClock}
	collOpts := ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		SyncookieMapLists:         dp.Objects.Lists,
		SyncookieMapStanding:      dp.Objects.Standing,
		SyncookieMapStandingStats: dp.Objects.StandingStats,
	}}
	if os.Getenv("EG_SYN_VLOG") != "" {
		collOpts.Programs.LogLevel = ebpf.LogLevelBranch
	}
	// The maps bpf/syncookie.c marks LIBBPF_PIN_BY_NAME are pinned, with
	// a PinDir; the shared ones are the limiter's.
	if dp.pinDir == "" {
		unpinned(spec)
	} else {
		s.pinDir = filepath.Join(dp.pinDir, "syn")
		mapDir := filepath.Join(s.pinDir, "maps")
		if err := os.MkdirAll(mapDir, 0o700); err != nil {
			return nil, fmt.Errorf("create syn pin dir: %w", err)
		}
		collOpts.Maps.PinPath = mapDir
		// Before standing was shared, validated sources had a table of
		// their own; its pin holds nothing anyone reads now.
		old := filepath.Join(mapDir, "syn_validated")
		if err := os.Remove(old); err == nil {
			log.Info("removed the retired syn_validated pin: validated sources are the standing table's now", "pin", old)
		} else if !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove the retired syn_validated pin", "pin", old, "err", err)
		}
	}
	if err := spec.LoadAndAssign(&s.Objects, &collOpts); err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("%w (syn path version changed): %w; 'edgectl detach --unpin' starts over", ErrIncompatiblePins, err)
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load syn path: %+v", ve)
		}
		return nil, fmt.Errorf("load syn path: %w", err)
	}
	defer func() {
		if err != nil {
			s.Objects.Close()
		}
	}()
	if err := s.ensureSecret(); err != nil {
		return nil, err
	}
	if err := s.Objects.SynNext.Put(uint32(0), dp.Objects.XdpLimiter); err != nil {
		return nil, fmt.Errorf("chain syn path to the limiter: %w", err)
	}
	dp.entry = s.Objects.EgSynXdp
	return s, nil
}

// ClearEntry makes Attach attach the limiter itself again (the SYN path
// could not be put in front of it).
func (d *Datapath) ClearEntry() { d.entry = nil }

// ensureSecret sets the cookie key once: a pinned key survives restarts,
// so cookies sent before one still validate after it.
func (s *SynPath) ensureSecret() error {
	var k SyncookieEgSynSecret
	if err := s.Objects.SynSecret.Lookup(uint32(0), &k); err != nil {
		return fmt.Errorf("read syn cookie key: %w", err)
	}
	if k.K0 != 0 || k.K1 != 0 {
		return nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("syn cookie key: %w", err)
	}
	k.K0, k.K1 = binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
	if err := s.Objects.SynSecret.Put(uint32(0), k); err != nil {
		return fmt.Errorf("write syn cookie key: %w", err)
	}
	return nil
}

func (s *SynPath) pin(name string) string {
	if s.pinDir == "" {
		return ""
	}
	return filepath.Join(s.pinDir, "links", name)
}

// AttachTC puts the tcx program on iface's ingress (it turns validated
// ACKs into requests for the kernel). A link pinned by an earlier run is
// updated in place.
func (s *SynPath) AttachTC(iface string) error {
	if _, ok := s.tcx[iface]; ok {
		return nil
	}
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("attach syn tcx to %s: %w", iface, err)
	}
	pin := s.pin("tcx-" + iface)
	if pin != "" {
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			if err := l.Update(s.Objects.EgSynTc); err == nil {
				s.tcx[iface] = l
				return nil
			}
			// Severed (interface re-created) or otherwise stale: start afresh.
			l.Unpin()
			l.Close()
		} else if l, err := adoptRenamed(s.log, filepath.Dir(s.pinDir), "tcx", ifc.Index, iface, s.Objects.EgSynTc, pin); err != nil {
			return fmt.Errorf("attach syn tcx to %s: %w", iface, err)
		} else if l != nil {
			s.tcx[iface] = l
			return nil
		}
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: s.Objects.EgSynTc, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("attach syn tcx to %s: %w", iface, err)
	}
	if pin != "" {
		if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
			l.Close()
			return fmt.Errorf("create syn link pin dir: %w", err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fmt.Errorf("pin syn tcx link on %s: %w", iface, err)
		}
	}
	s.tcx[iface] = l
	return nil
}

// DetachTC removes the tcx program from iface.
func (s *SynPath) DetachTC(iface string) error {
	l, ok := s.tcx[iface]
	if !ok {
		return nil
	}
	delete(s.tcx, iface)
	if err := l.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin syn tcx link on %s: %w", iface, err)
	}
	return l.Close()
}

// TCIfaces are the interfaces the tcx program is on.
func (s *SynPath) TCIfaces() []string {
	out := make([]string, 0, len(s.tcx))
	for i := range s.tcx {
		out = append(out, i)
	}
	return out
}

// Release closes file descriptors; pinned links keep the SYN path working.
func (s *SynPath) Release() {
	for _, l := range s.tcx {
		l.Close()
	}
	s.Objects.Close()
}

// Close takes the tcx programs off their interfaces and closes the
// objects. An XDP link keeps running the entry program it holds.
func (s *SynPath) Close() error {
	var errs []error
	for iface := range s.tcx {
		errs = append(errs, s.DetachTC(iface))
	}
	errs = append(errs, s.Objects.Close())
	return errors.Join(errs...)
}
