package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// SynMode is a protected service's SYN protection mode.
type SynMode = loader.SyncookieEgSynMode

// SYN protection modes.
const (
	SynOff     = loader.SyncookieEgSynModeEG_SYN_OFF
	SynMonitor = loader.SyncookieEgSynModeEG_SYN_MONITOR
	SynAuto    = loader.SyncookieEgSynModeEG_SYN_AUTO
	SynAlways  = loader.SyncookieEgSynModeEG_SYN_ALWAYS
)

// MaxSynServices and MaxSynEndpoints bound what a policy may protect.
const (
	MaxSynServices  = int(loader.SyncookieEgSynSizesEG_SYN_MAX_SERVICES)
	MaxSynEndpoints = int(loader.SyncookieEgSynSizesEG_SYN_MAX_ENDPOINTS)
)

// synRateWindow is the data plane's auto-mode measuring window (2^30 ns).
const synRateWindow = time.Duration(1) << loader.SyncookieEgSynSizesEG_SYN_RATE_SHIFT

// SynService is one protected service as the data plane holds it. Its id
// is its index in the slice given to Apply.
type SynService struct {
	Mode SynMode
	// Endpoints are the address/port pairs it covers; an unspecified
	// address (0.0.0.0 or ::) covers the port on every local address.
	Endpoints []netip.AddrPort
	MSS4      uint16 // MSS announced in SYN-ACKs over IPv4
	MSS6      uint16 // ... over IPv6
	WScale    uint8  // window scale announced (0-14)
	// Auto mode: on at OnRate SYNs/s, off after Hold under OffRate.
	OnRate, OffRate uint64
	Hold            time.Duration
	// OutOfState passes segments that belong to no connection within this
	// budget (per service); zero drops them all.
	OutOfState Rate
	// Answers limits SYN-ACKs per source prefix (AnswerLen4/6 bits).
	Answers                Rate
	AnswerLen4, AnswerLen6 uint8
	// ValidatedFor is how long a source that completed a handshake
	// through a cookie bypasses the SYN path.
	ValidatedFor time.Duration
}

// SynCounters are one service's SYN path counters, summed over CPUs.
type SynCounters struct {
	SYNs, Answered, WouldAnswer, AnswerLimited, BadSYN, ValidatedPass uint64
	CookieValid, CookieInvalid, OutOfStateDrop, OutOfStateBudget      uint64
	Established, Activations, Requests, RequestFailures, Denied       uint64
	Active                                                            bool
}

// Syn writes and reads the SYN path's maps.
type Syn struct {
	o         *loader.SyncookieObjects
	testClock bool
}

// NewSyn wraps a loaded SYN path.
func NewSyn(p *loader.SynPath) *Syn { return &Syn{o: &p.Objects, testClock: p.TestClock} }

func gcraNs(r Rate) (t, tau uint64, err error) {
	if !r.Limited() {
		return 0, 0, nil
	}
	if r.Per <= 0 {
		return 0, 0, fmt.Errorf("rate %d per %v: the period must be positive", r.Count, r.Per)
	}
	t = uint64(r.Per) / r.Count
	if t == 0 {
		t = 1
	}
	b := r.Burst
	if b == 0 {
		b = 1
	}
	return t, t * (b - 1), nil
}

func perWindow(perSecond uint64) uint32 {
	n := perSecond * uint64(synRateWindow) / uint64(time.Second)
	if n > 1<<32-1 {
		return 1<<32 - 1
	}
	if n == 0 && perSecond > 0 {
		return 1
	}
	return uint32(n)
}

func (s SynService) compile() (loader.SyncookieEgSynService, error) {
	var v loader.SyncookieEgSynService
	if s.Mode > SynAlways {
		return v, fmt.Errorf("unknown syn mode %d", s.Mode)
	}
	if s.WScale > 14 {
		return v, fmt.Errorf("window scale %d: at most 14", s.WScale)
	}
	if s.AnswerLen4 > 32 || s.AnswerLen6 > 128 {
		return v, fmt.Errorf("answer prefix /%d, /%d: at most /32 and /128", s.AnswerLen4, s.AnswerLen6)
	}
	oosT, oosTau, err := gcraNs(s.OutOfState)
	if err != nil {
		return v, fmt.Errorf("out-of-state budget: %w", err)
	}
	ansT, ansTau, err := gcraNs(s.Answers)
	if err != nil {
		return v, fmt.Errorf("answer budget: %w", err)
	}
	v = loader.SyncookieEgSynService{
		Mode: uint8(s.Mode), Wscale: s.WScale, Valid: 1, Mss4: s.MSS4, Mss6: s.MSS6,
		OnSyns: perWindow(s.OnRate), OffSyns: perWindow(s.OffRate), HoldNs: uint64(max(s.Hold, 0)),
		OosT: oosT, OosTau: oosTau, AnsT: ansT, AnsTau: ansTau, AnsLen4: s.AnswerLen4, AnsLen6: s.AnswerLen6,
		ValidatedNs: uint64(max(s.ValidatedFor, 0)),
	}
	return v, nil
}

func endpointKey(ap netip.AddrPort) loader.SyncookieEgSynEndpoint {
	var k loader.SyncookieEgSynEndpoint
	if a := ap.Addr(); a.IsValid() && !a.Unmap().IsUnspecified() {
		k.Addr = Addr16(a)
	}
	p := ap.Port()
	k.Port = p>>8 | p<<8 // network order in a little-endian u16
	return k
}

// ApplySyn makes services the protected services. Everything is checked
// before the first write. Services are written before the endpoints that
// point at them and old endpoints removed last, so a packet always finds a
// complete service; a write failing midway leaves some endpoints with the
// new services (the error says so and the next apply repairs it).
func (s *Syn) ApplySyn(services []SynService) error {
	if len(services) > MaxSynServices {
		return fmt.Errorf("syn: %d services, at most %d", len(services), MaxSynServices)
	}
	vals := make([]loader.SyncookieEgSynService, len(services))
	want := map[loader.SyncookieEgSynEndpoint]uint32{}
	for i, svc := range services {
		v, err := svc.compile()
		if err != nil {
			return fmt.Errorf("syn service %d: %w", i, err)
		}
		vals[i] = v
		for _, ep := range svc.Endpoints {
			k := endpointKey(ep)
			if j, dup := want[k]; dup && j != uint32(i) {
				return fmt.Errorf("syn: endpoint %v in services %d and %d", ep, j, i)
			}
			want[k] = uint32(i)
		}
	}
	if len(want) > MaxSynEndpoints {
		return fmt.Errorf("syn: %d endpoints, at most %d", len(want), MaxSynEndpoints)
	}
	for i, v := range vals {
		if err := s.o.SynServices.Put(uint32(i), v); err != nil {
			return fmt.Errorf("syn: write service %d: %w", i, err)
		}
	}
	for k, id := range want {
		if err := s.o.SynEndpoints.Put(k, id); err != nil {
			return fmt.Errorf("syn: write endpoint: %w (the next apply repairs it)", err)
		}
	}
	var k loader.SyncookieEgSynEndpoint
	var id uint32
	var stale []loader.SyncookieEgSynEndpoint
	it := s.o.SynEndpoints.Iterate()
	for it.Next(&k, &id) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("syn: read endpoints: %w", err)
	}
	for _, k := range stale {
		if err := s.o.SynEndpoints.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("syn: remove endpoint: %w (the next apply repairs it)", err)
		}
	}
	for i := len(vals); i < MaxSynServices; i++ {
		var old loader.SyncookieEgSynService
		if err := s.o.SynServices.Lookup(uint32(i), &old); err != nil {
			return fmt.Errorf("syn: read service %d: %w", i, err)
		}
		if old.Valid == 0 {
			continue
		}
		if err := s.o.SynServices.Put(uint32(i), loader.SyncookieEgSynService{}); err != nil {
			return fmt.Errorf("syn: clear service %d: %w", i, err)
		}
		// A later service in this slot starts with fresh state.
		if err := s.o.SynState.Put(uint32(i), loader.SyncookieEgSynState{}); err != nil {
			return fmt.Errorf("syn: clear service %d state: %w", i, err)
		}
	}
	return nil
}

// SynCounters returns the first n services' counters.
func (s *Syn) SynCounters(n int) ([]SynCounters, error) {
	out := make([]SynCounters, 0, n)
	for i := 0; i < n && i < MaxSynServices; i++ {
		var per []loader.SyncookieEgSynCounters
		if err := s.o.SynCounters.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("syn: read counters of service %d: %w", i, err)
		}
		var sum [loader.SyncookieEgSynCounterEG_SYNC_MAX]uint64
		for _, c := range per {
			for j := range sum {
				sum[j] += c.C[j]
			}
		}
		var st loader.SyncookieEgSynState
		if err := s.o.SynState.Lookup(uint32(i), &st); err != nil {
			return nil, fmt.Errorf("syn: read state of service %d: %w", i, err)
		}
		out = append(out, SynCounters{
			SYNs: sum[loader.SyncookieEgSynCounterEG_SYNC_SYN], Answered: sum[loader.SyncookieEgSynCounterEG_SYNC_ANSWERED],
			WouldAnswer:      sum[loader.SyncookieEgSynCounterEG_SYNC_WOULD_ANSWER],
			AnswerLimited:    sum[loader.SyncookieEgSynCounterEG_SYNC_ANSWER_LIMITED],
			BadSYN:           sum[loader.SyncookieEgSynCounterEG_SYNC_BAD_SYN],
			ValidatedPass:    sum[loader.SyncookieEgSynCounterEG_SYNC_VALIDATED_PASS],
			CookieValid:      sum[loader.SyncookieEgSynCounterEG_SYNC_COOKIE_VALID],
			CookieInvalid:    sum[loader.SyncookieEgSynCounterEG_SYNC_COOKIE_INVALID],
			OutOfStateDrop:   sum[loader.SyncookieEgSynCounterEG_SYNC_OOS_DROP],
			OutOfStateBudget: sum[loader.SyncookieEgSynCounterEG_SYNC_OOS_BUDGET],
			Established:      sum[loader.SyncookieEgSynCounterEG_SYNC_ESTABLISHED],
			Activations:      sum[loader.SyncookieEgSynCounterEG_SYNC_ACTIVATIONS],
			Requests:         sum[loader.SyncookieEgSynCounterEG_SYNC_REQSK],
			RequestFailures:  sum[loader.SyncookieEgSynCounterEG_SYNC_REQSK_FAIL],
			Denied:           sum[loader.SyncookieEgSynCounterEG_SYNC_DENY],
			Active:           st.Active != 0,
		})
	}
	return out, nil
}

// SynModeName names a protection mode as the policy spells it.
func SynModeName(m SynMode) string {
	switch m {
	case SynOff:
		return "off"
	case SynMonitor:
		return "monitor"
	case SynAuto:
		return "auto"
	case SynAlways:
		return "always"
	}
	return fmt.Sprintf("mode %d", m)
}

// SetSynTestClock sets the SYN path's clock when loaded with TestClock.
func (s *Syn) SetSynTestClock(ns uint64) error {
	return s.o.SynTestClock.Put(uint32(0), ns)
}

// SynState is the SYN path's state as read at one moment, for the
// reference model (refmodel.Model.LoadSyn): one field per map, read
// whole, except the answer budgets, looked up entry by entry (Answer).
// The limiter's maps the SYN path shares (lists, standing) are the
// limiter's State's.
type SynState struct {
	// NowNS is the SYN path's clock when the read began: its test clock,
	// or CLOCK_MONOTONIC as bpf_ktime_get_ns reads it.
	NowNS     uint64
	Endpoints map[loader.SyncookieEgSynEndpoint]uint32
	// Services and State by service id: every slot of the arrays.
	Services map[uint32]loader.SyncookieEgSynService
	State    map[uint32]loader.SyncookieEgSynState
	Secret   loader.SyncookieEgSynSecret
	s        *Syn
}

// Answer looks one source prefix's answer budget (a GCRA TAT, ns) up.
func (st *SynState) Answer(k loader.SyncookieEgSynPrefixKey) (uint64, bool, error) {
	var tat uint64
	err := st.s.o.SynAnswers.Lookup(k, &tat)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("syn: read answer budget: %w", err)
	}
	return tat, true, nil
}

// ReadSynState reads the SYN path's maps (endpoints, services, state,
// the cookie key and the clock). The key stays in the process: it is
// read so the model computes the cookies the program does.
func (s *Syn) ReadSynState() (*SynState, error) {
	st := &SynState{s: s, Endpoints: map[loader.SyncookieEgSynEndpoint]uint32{},
		Services: map[uint32]loader.SyncookieEgSynService{}, State: map[uint32]loader.SyncookieEgSynState{}}
	var err error
	if s.testClock {
		err = s.o.SynTestClock.Lookup(uint32(0), &st.NowNS)
	} else {
		st.NowNS, err = MonoNow()
	}
	if err != nil {
		return nil, fmt.Errorf("syn: read the clock: %w", err)
	}
	var ek loader.SyncookieEgSynEndpoint
	var id uint32
	it := s.o.SynEndpoints.Iterate()
	for it.Next(&ek, &id) {
		st.Endpoints[ek] = id
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("syn: read endpoints: %w", err)
	}
	var sv loader.SyncookieEgSynService
	it = s.o.SynServices.Iterate()
	for it.Next(&id, &sv) {
		st.Services[id] = sv
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("syn: read services: %w", err)
	}
	var ss loader.SyncookieEgSynState
	it = s.o.SynState.Iterate()
	for it.Next(&id, &ss) {
		st.State[id] = ss
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("syn: read service state: %w", err)
	}
	if err := s.o.SynSecret.Lookup(uint32(0), &st.Secret); err != nil {
		return nil, fmt.Errorf("syn: read the cookie key: %w", err)
	}
	return st, nil
}
