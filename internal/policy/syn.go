package policy

import (
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/bpfsizes"
)

// SYNMode is a protected service's SYN protection mode.
type SYNMode string

// SYN protection modes (docs/tcp.md).
const (
	SYNOff     SYNMode = "off"     // the limiter alone
	SYNMonitor SYNMode = "monitor" // counted as if on; the kernel answers
	SYNAuto    SYNMode = "auto"    // on above auto.on, off below auto.off for auto.hold
	SYNAlways  SYNMode = "always"
)

// SYN is the syn: section: TCP services whose handshakes the data plane
// answers with SYN cookies.
type SYN struct {
	// ValidatedFor is how long a source that completed a handshake
	// through a cookie bypasses the SYN path (0: never).
	ValidatedFor time.Duration
	Services     []SYNService
}

// SYNService is one protected service.
type SYNService struct {
	Name string
	// Listen are the protected address:port pairs; 0.0.0.0 and :: stand
	// for every local address of that family.
	Listen     []netip.AddrPort
	Protection SYNMode
	// Auto mode: on at On SYNs, off again after Hold under Off.
	On, Off Rate
	Hold    time.Duration
	// MSS and MSS6 are announced in SYN-ACKs; WindowScale is ours.
	MSS, MSS6   uint16
	WindowScale uint8
	// Answers bound SYN-ACKs per source prefix (AnswerPrefix4/6 bits):
	// the host must not become a reflector.
	Answers                      Limit
	AnswerPrefix4, AnswerPrefix6 uint8
	// OutOfState passes segments that belong to no connection within this
	// budget; zero (out_of_state: drop) drops them.
	OutOfState Limit
	Pos        Pos
}

// SYN defaults.
const (
	DefaultSYNValidatedFor = 10 * time.Minute
	DefaultSYNMSS          = 1460
	DefaultSYNWindowScale  = 7
	// The SYN path's tables (EG_SYN_MAX_*, through bpfsizes): one
	// endpoint per listen entry.
	maxSYNServices = bpfsizes.SynMaxServices
	maxSYNListen   = bpfsizes.SynMaxEndpoints
)

func defaultSYNService() SYNService {
	return SYNService{
		Protection: SYNAuto,
		On:         Rate{Count: 1000, Per: time.Second},
		Off:        Rate{Count: 200, Per: time.Second},
		Hold:       30 * time.Second,
		MSS:        DefaultSYNMSS, MSS6: DefaultSYNMSS - 20, WindowScale: DefaultSYNWindowScale,
		Answers:       Limit{Rate: Rate{Count: 1000, Per: time.Second}, Burst: 2000},
		AnswerPrefix4: 24, AnswerPrefix6: 48,
	}
}

// syn parses the syn: section.
func (ps *parser) syn(n *yaml.Node) *SYN {
	f := ps.Fields(n, "syn", "validated_for", "services")
	if f == nil {
		return nil
	}
	s := &SYN{ValidatedFor: DefaultSYNValidatedFor}
	if v, ok := f["validated_for"]; ok {
		s.ValidatedFor = ps.duration(v, "syn.validated_for", 0, maxStandingDuration, s.ValidatedFor)
	}
	if v, ok := f["services"]; ok {
		items := ps.Seq(v, "syn.services")
		if len(items) > maxSYNServices {
			ps.Errorf(v, "syn.services: %d services, at most %d", len(items), maxSYNServices)
		}
		names := map[string]bool{}
		seen := map[netip.AddrPort]string{}
		listens := 0
		for _, item := range items {
			svc := ps.synService(item)
			if svc.Name != "" && names[svc.Name] {
				ps.Errorf(item, "syn.services: service %q twice", svc.Name)
			}
			names[svc.Name] = true
			for _, ap := range svc.Listen {
				if other, dup := seen[ap]; dup {
					ps.Errorf(item, "syn.services %s: %s is already protected by %s", svc.Name, ap, other)
				}
				seen[ap] = svc.Name
			}
			listens += len(svc.Listen)
			s.Services = append(s.Services, svc)
		}
		if listens > maxSYNListen {
			ps.Errorf(v, "syn.services: %d listen entries, at most %d", listens, maxSYNListen)
		}
	}
	return s
}

func (ps *parser) synService(n *yaml.Node) SYNService {
	svc := defaultSYNService()
	svc.Pos = Pos{Line: n.Line, Column: n.Column}
	f := ps.Fields(n, "syn service", "name", "listen", "protection", "auto", "mss", "mss6", "window_scale",
		"answers", "out_of_state")
	if f == nil {
		return svc
	}
	if v, ok := f["name"]; ok {
		svc.Name, _ = ps.Scalar(v, "syn service name")
	} else {
		ps.Errorf(n, "syn service needs a name")
	}
	where := "syn service " + svc.Name
	if v, ok := f["listen"]; ok {
		for _, item := range ps.Seq(v, where+" listen") {
			s, ok := ps.Scalar(item, where+" listen")
			if !ok {
				continue
			}
			ap, err := netip.ParseAddrPort(s)
			if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
				ps.Errorf(item, "%s listen: %q is not ADDRESS:PORT (0.0.0.0:443, [::]:443, 198.51.100.7:80)", where, s)
				continue
			}
			svc.Listen = append(svc.Listen, ap)
		}
	}
	if len(svc.Listen) == 0 {
		ps.Errorf(n, "%s: listen needs at least one ADDRESS:PORT", where)
	}
	if v, ok := f["protection"]; ok {
		svc.Protection = SYNMode(ps.enum(v, where+" protection", string(svc.Protection),
			string(SYNOff), string(SYNMonitor), string(SYNAuto), string(SYNAlways)))
	}
	if v, ok := f["auto"]; ok {
		af := ps.Fields(v, where+" auto", "on", "off", "hold")
		if r, ok := af["on"]; ok {
			svc.On = ps.limit(r, where+" auto.on", Packets).Rate
		}
		if r, ok := af["off"]; ok {
			svc.Off = ps.limit(r, where+" auto.off", Packets).Rate
		}
		if h, ok := af["hold"]; ok {
			svc.Hold = ps.duration(h, where+" auto.hold", 0, maxStandingDuration, svc.Hold)
		}
		if svc.On.IsZero() {
			ps.Errorf(v, "%s auto.on must be above zero", where)
		}
		if rateAbove(svc.Off, svc.On) {
			ps.Errorf(v, "%s: auto.off must not be above auto.on (hysteresis: on at on, off below off)", where)
		}
	}
	if v, ok := f["mss"]; ok {
		if m, ok := ps.UintIn(v, where+" mss", 536, 65495); ok {
			svc.MSS = uint16(m)
			if _, set := f["mss6"]; !set {
				svc.MSS6 = uint16(max(m-20, 1220))
			}
		}
	}
	if v, ok := f["mss6"]; ok {
		if m, ok := ps.UintIn(v, where+" mss6", 1220, 65475); ok {
			svc.MSS6 = uint16(m)
		}
	}
	if v, ok := f["window_scale"]; ok {
		if w, ok := ps.UintIn(v, where+" window_scale", 0, 14); ok {
			svc.WindowScale = uint8(w)
		}
	}
	if v, ok := f["answers"]; ok {
		var rateNode *yaml.Node = v
		if v.Kind == yaml.MappingNode {
			af := ps.Fields(v, where+" answers", "rate", "burst", "per")
			if p, ok := af["per"]; ok {
				pf := ps.Fields(p, where+" answers.per", "ipv4", "ipv6")
				if x, ok := pf["ipv4"]; ok {
					if b, ok := ps.UintIn(x, where+" answers.per.ipv4", 0, 32); ok {
						svc.AnswerPrefix4 = uint8(b)
					}
				}
				if x, ok := pf["ipv6"]; ok {
					if b, ok := ps.UintIn(x, where+" answers.per.ipv6", 0, 128); ok {
						svc.AnswerPrefix6 = uint8(b)
					}
				}
			}
			// limit() reads rate and burst; per is ours.
			rateNode = &yaml.Node{Kind: yaml.MappingNode, Line: v.Line, Column: v.Column}
			for i := 0; i+1 < len(v.Content); i += 2 {
				if v.Content[i].Value != "per" {
					rateNode.Content = append(rateNode.Content, v.Content[i], v.Content[i+1])
				}
			}
		}
		svc.Answers = ps.limit(rateNode, where+" answers", Packets)
	}
	if v, ok := f["out_of_state"]; ok {
		if v.Kind == yaml.ScalarNode && strings.EqualFold(v.Value, "drop") {
			svc.OutOfState = Limit{}
		} else {
			svc.OutOfState = ps.limit(v, where+" out_of_state", Packets)
		}
	}
	return svc
}

// rateAbove reports whether a is faster than b.
func rateAbove(a, b Rate) bool {
	if a.IsZero() || b.IsZero() {
		return !a.IsZero() && b.IsZero()
	}
	// a.Count/a.Per > b.Count/b.Per, without overflow for sane values.
	return float64(a.Count)/float64(a.Per) > float64(b.Count)/float64(b.Per)
}
