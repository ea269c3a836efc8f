package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/bpfsizes"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
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

// synTable is the syn: section (docs/tcp.md).
var synTable = yamlcheck.NewTable("syn",
	yamlcheck.Val("validated_for", yamlcheck.Duration{Min: 0, Max: maxStandingDuration},
		func(s *SYN) *time.Duration { return &s.ValidatedFor },
		"how long a source that completed a handshake through a cookie bypasses the SYN path (0: never)"),
	yamlcheck.Val[SYN, []SYNService]("services", synServices{}, func(s *SYN) *[]SYNService { return &s.Services },
		"the protected TCP services (syn service below)"),
)

// synServiceTable is one syn.services entry.
var synServiceTable = yamlcheck.NewTable("syn service",
	yamlcheck.Val("name", yamlcheck.String{}, func(s *SYNService) *string { return &s.Name }, "the service's name").
		Required("syn service needs a name"),
	yamlcheck.Val[SYNService, []netip.AddrPort]("listen", synListen{}, func(s *SYNService) *[]netip.AddrPort { return &s.Listen },
		"the protected ADDRESS:PORT pairs (0.0.0.0 and :: for every local address of the family); at least one"),
	yamlcheck.Val("protection", yamlcheck.Enum[SYNMode]{Values: []SYNMode{SYNOff, SYNMonitor, SYNAuto, SYNAlways}},
		func(s *SYNService) *SYNMode { return &s.Protection },
		"off (the limiter alone), monitor (counted as if on), auto (on above auto.on) or always"),
	yamlcheck.Sub("auto", "protection: auto's switch (hysteresis: on at on, off below off for hold)",
		yamlcheck.Func("on", "packets per time", "SYNs per time that turn cookies on",
			func(c *yamlcheck.Checker, n *yaml.Node, where string, s *SYNService) {
				s.On = parseLimit(c, n, where, Packets).Rate
			},
			func(s *SYNService) string { return FormatRate(s.On, Packets) }),
		yamlcheck.Func("off", "packets per time", "SYNs per time under which they turn off",
			func(c *yamlcheck.Checker, n *yaml.Node, where string, s *SYNService) {
				s.Off = parseLimit(c, n, where, Packets).Rate
			},
			func(s *SYNService) string { return FormatRate(s.Off, Packets) }),
		yamlcheck.Val("hold", yamlcheck.Duration{Min: 0, Max: maxStandingDuration}, func(s *SYNService) *time.Duration { return &s.Hold },
			"how long the rate must stay under off"),
	),
	yamlcheck.Val("mss", yamlcheck.Uint[uint16]{Min: 536, Max: 65495}, func(s *SYNService) *uint16 { return &s.MSS },
		"the MSS announced in IPv4 SYN-ACKs"),
	yamlcheck.Val("mss6", yamlcheck.Uint[uint16]{Min: 1220, Max: 65475}, func(s *SYNService) *uint16 { return &s.MSS6 },
		"the MSS announced in IPv6 SYN-ACKs; by default mss - 20 (at least 1220)"),
	yamlcheck.Val("window_scale", yamlcheck.Uint[uint8]{Min: 0, Max: 14}, func(s *SYNService) *uint8 { return &s.WindowScale },
		"our window scale"),
	yamlcheck.Func("answers", "packets per time, or {rate, burst, per: {ipv4: 0-32, ipv6: 0-128}}",
		"SYN-ACKs per source prefix: the host must not become a reflector", synAnswers,
		func(s *SYNService) string {
			return fmt.Sprintf("%s per /%d /%d", s.Answers.format(Packets), s.AnswerPrefix4, s.AnswerPrefix6)
		}),
	yamlcheck.Val[SYNService, Limit]("out_of_state", outOfState{}, func(s *SYNService) *Limit { return &s.OutOfState },
		"segments that belong to no connection pass within this budget; drop: none pass"),
)

// syn parses the syn: section.
func (ps *parser) syn(n *yaml.Node) *SYN {
	s := &SYN{ValidatedFor: DefaultSYNValidatedFor}
	if synTable.Parse(&ps.Checker, n, s) == nil {
		return nil
	}
	return s
}

// synServices is syn.services: at most maxSYNServices services (and
// maxSYNListen listen entries), each name and ADDRESS:PORT once.
type synServices struct{}

func (synServices) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]SYNService, bool) {
	items := c.Seq(n, where)
	if len(items) > maxSYNServices {
		c.Errorf(n, "syn.services: %d services, at most %d", len(items), maxSYNServices)
	}
	var out []SYNService
	names := map[string]bool{}
	seen := map[netip.AddrPort]string{}
	listens := 0
	for _, item := range items {
		svc := synService(c, item)
		if svc.Name != "" && names[svc.Name] {
			c.Errorf(item, "syn.services: service %q twice", svc.Name)
		}
		names[svc.Name] = true
		for _, ap := range svc.Listen {
			if other, dup := seen[ap]; dup {
				c.Errorf(item, "syn.services %s: %s is already protected by %s", svc.Name, ap, other)
			}
			seen[ap] = svc.Name
		}
		listens += len(svc.Listen)
		out = append(out, svc)
	}
	if listens > maxSYNListen {
		c.Errorf(n, "syn.services: %d listen entries, at most %d", listens, maxSYNListen)
	}
	return out, true
}

func (k synServices) Format(v []SYNService) string { return "[" + strings.Join(k.Items(v), "; ") + "]" }

func (synServices) Items(v []SYNService) []string {
	out := make([]string, len(v))
	for i := range v {
		out[i] = synServiceTable.String(&v[i])
	}
	return out
}

func (synServices) Describe() string {
	return fmt.Sprintf("list of at most %d services", maxSYNServices)
}

func synService(c *yamlcheck.Checker, n *yaml.Node) SYNService {
	svc := defaultSYNService()
	svc.Pos = Pos{Line: n.Line, Column: n.Column}
	name := ""
	if v := yamlcheck.Lookup(n, "name"); v != nil && v.Kind == yaml.ScalarNode {
		name = v.Value
	}
	where := "syn service " + name
	f := synServiceTable.ParseItem(c, n, where, &svc)
	if f == nil {
		return svc
	}
	if len(svc.Listen) == 0 {
		c.Errorf(n, "%s: listen needs at least one ADDRESS:PORT", where)
	}
	if v, ok := f["auto"]; ok {
		if svc.On.IsZero() {
			c.Errorf(v, "%s auto.on must be above zero", where)
		}
		if rateAbove(svc.Off, svc.On) {
			c.Errorf(v, "%s: auto.off must not be above auto.on (hysteresis: on at on, off below off)", where)
		}
	}
	if _, ok := f["mss6"]; !ok {
		if _, ok := f["mss"]; ok {
			svc.MSS6 = max(svc.MSS-20, 1220)
		}
	}
	return svc
}

// synListen is a service's ADDRESS:PORT list.
type synListen struct{}

func (synListen) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]netip.AddrPort, bool) {
	var out []netip.AddrPort
	for _, item := range c.Seq(n, where) {
		s, ok := c.Scalar(item, where)
		if !ok {
			continue
		}
		ap, err := netip.ParseAddrPort(s)
		if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			c.Errorf(item, "%s: %q is not ADDRESS:PORT (0.0.0.0:443, [::]:443, 198.51.100.7:80)", where, s)
			continue
		}
		out = append(out, ap)
	}
	return out, true
}

func (synListen) Format(v []netip.AddrPort) string {
	out := make([]string, len(v))
	for i, ap := range v {
		out[i] = ap.String()
	}
	return "[" + strings.Join(out, ", ") + "]"
}

func (synListen) Describe() string { return "list of ADDRESS:PORT" }

// synAnswersPer is answers.per: the source prefix SYN-ACKs are counted by.
var synAnswersPer = yamlcheck.NewTable("answers.per",
	yamlcheck.Val("ipv4", yamlcheck.Uint[uint8]{Min: 0, Max: 32}, func(s *SYNService) *uint8 { return &s.AnswerPrefix4 }, "IPv4 prefix length"),
	yamlcheck.Val("ipv6", yamlcheck.Uint[uint8]{Min: 0, Max: 128}, func(s *SYNService) *uint8 { return &s.AnswerPrefix6 }, "IPv6 prefix length"),
)

// synAnswers parses a service's answers: a limit, with per: {ipv4, ipv6}
// prefix lengths beside rate and burst.
func synAnswers(c *yamlcheck.Checker, v *yaml.Node, where string, svc *SYNService) {
	rateNode := v
	if v.Kind == yaml.MappingNode {
		af := c.Fields(v, where, "rate", "burst", "per")
		if p, ok := af["per"]; ok {
			synAnswersPer.ParseAt(c, p, where+".per", svc)
		}
		// parseLimit reads rate and burst; per is ours.
		rateNode = &yaml.Node{Kind: yaml.MappingNode, Line: v.Line, Column: v.Column}
		for i := 0; i+1 < len(v.Content); i += 2 {
			if v.Content[i].Value != "per" {
				rateNode.Content = append(rateNode.Content, v.Content[i], v.Content[i+1])
			}
		}
	}
	svc.Answers = parseLimit(c, rateNode, where, Packets)
}

// outOfState is drop, or a limit in packets.
type outOfState struct{}

func (outOfState) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (Limit, bool) {
	if n.Kind == yaml.ScalarNode && strings.EqualFold(n.Value, "drop") {
		return Limit{}, true
	}
	return parseLimit(c, n, where, Packets), true
}

func (outOfState) Format(l Limit) string {
	if !l.IsSet() {
		return "drop"
	}
	return l.format(Packets)
}

func (outOfState) Describe() string { return "drop, or packets per time (or {rate, burst})" }

// syn reports a changed syn: section: its presence, and each knob that
// changed (services one by one).
func (d *differ) syn(a, b *SYN) {
	switch {
	case a == nil && b == nil:
	case a == nil:
		d.add('+', "syn section: %s", synTable.String(b))
	case b == nil:
		d.add('-', "syn section (SYN cookies off)")
	default:
		synTable.DiffWith("syn ", a, b, d.emit)
	}
}

// rateAbove reports whether a is faster than b.
func rateAbove(a, b Rate) bool {
	if a.IsZero() || b.IsZero() {
		return !a.IsZero() && b.IsZero()
	}
	// a.Count/a.Per > b.Count/b.Per, without overflow for sane values.
	return float64(a.Count)/float64(a.Per) > float64(b.Count)/float64(b.Per)
}
