package bgp

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// Op is what happened to an announcement (an audit record).
type Op string

// Operations.
const (
	OpAnnounce Op = "announce" // new (announced, or logged in dry run)
	OpRenew    Op = "renew"    // asked again: its expiry moved
	OpWithdraw Op = "withdraw" // withdrawn (expired, by an operator, its cause ended, a guard now refuses it)
	OpRefuse   Op = "refuse"   // a guard refused it
	OpFail     Op = "fail"     // GoBGP refused the path
)

// Event is one change, for the log, the audit file and metrics.
type Event struct {
	Op           Op           `json:"op"`
	Announcement Announcement `json:"announcement"`
	Why          string       `json:"why"`
	At           time.Time    `json:"at"`
	Err          string       `json:"error,omitempty"`
}

// maxReceived is how many routes of one family a peer may send us (we
// use none): past it the session is reset.
const maxReceived = 1000

// Options configure a speaker.
type Options struct {
	Logger *slog.Logger
	// Audit is told of every event (the daemon appends it to its audit
	// file); it must not call the speaker.
	Audit func(Event)
}

type entry struct {
	Announcement
	uuid []byte // GoBGP's path id; nil: not in GoBGP's table
}

// Speaker holds the announcements and the BGP sessions. Its methods are
// safe for concurrent use.
type Speaker struct {
	log   *slog.Logger
	audit func(Event)

	mu      sync.Mutex
	cfg     Config
	started bool // cfg's sessions are running
	srv     *server.BgpServer
	anns    map[uint64]*entry
	nextID  uint64
	counts  map[Op]uint64
	refused map[string]uint64 // by guard
}

// New is a speaker with no sessions: Configure starts them.
func New(o Options) *Speaker {
	log := cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	audit := o.Audit
	if audit == nil {
		audit = func(Event) {}
	}
	return &Speaker{log: log, audit: audit, anns: map[uint64]*entry{}, nextID: 1, counts: map[Op]uint64{},
		refused: map[string]uint64{}}
}

// Configure applies a configuration: sessions are (re)started when their
// settings changed; announcements a guard now refuses are withdrawn; dry
// run withdraws what was announced and keeps it listed, leaving dry run
// announces it.
func (s *Speaker) Configure(ctx context.Context, cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.started && !s.cfg.SessionEqual(cfg) {
		s.stopLocked(ctx)
	}
	s.cfg = cfg
	if !s.started {
		if err := s.startLocked(ctx); err != nil {
			s.stopLocked(ctx)
			return err
		}
	}
	for _, id := range s.idsLocked() {
		e := s.anns[id]
		if why := s.guardLocked(e.Announcement, id); why != "" {
			s.withdrawLocked(e, "the policy's guards now refuse it: "+why, now)
			continue
		}
		s.syncLocked(e, now)
	}
	return nil
}

func (s *Speaker) startLocked(ctx context.Context) error {
	if s.srv == nil {
		s.srv = server.NewBgpServer(server.LoggerOption(&gobgpLogger{log: s.log.With("gobgp", true)}))
		go s.srv.Serve()
	}
	c := s.cfg
	// ListenPort -1: the speaker opens its sessions and accepts none.
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: c.LocalAS, RouterId: c.RouterID.String(), ListenPort: -1}}); err != nil {
		return fmt.Errorf("bgp: start: %w", err)
	}
	s.started = true
	// Nothing a peer sends is used: every route learned from a peer is
	// rejected on import (so none is kept, nor passed on to the other
	// peers: the host is never a transit), and a peer that sends more
	// than maxReceived of a family has its session reset.
	// StartBgp starts from an empty policy table: the policy is added on
	// every start.
	stmt := func(name string, t api.Conditions_RouteType) *api.Statement {
		return &api.Statement{Name: name, Conditions: &api.Conditions{RouteType: t},
			Actions: &api.Actions{RouteAction: api.RouteAction_REJECT}}
	}
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: "edgeguard-reject-learned",
		Statements: []*api.Statement{stmt("edgeguard-reject-external", api.Conditions_ROUTE_TYPE_EXTERNAL),
			stmt("edgeguard-reject-internal", api.Conditions_ROUTE_TYPE_INTERNAL)}}}); err != nil {
		return fmt.Errorf("bgp: reject what peers send: %w", err)
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_IMPORT, Policies: []*api.Policy{{Name: "edgeguard-reject-learned"}},
		DefaultAction: api.RouteAction_ACCEPT}}); err != nil {
		return fmt.Errorf("bgp: reject what peers send: %w", err)
	}
	for i, n := range c.Neighbors {
		p := &api.Peer{
			Conf: &api.PeerConf{NeighborAddress: n.Address.String(), PeerAsn: n.AS, AuthPassword: c.password(i),
				Description: "edgeguard"},
			Transport: &api.Transport{RemotePort: 179},
			Timers:    &api.Timers{Config: &api.TimersConfig{ConnectRetry: 5, HoldTime: 90, KeepaliveInterval: 30}},
		}
		if n.LocalAddress.IsValid() {
			p.Transport.LocalAddress = n.LocalAddress.String()
		}
		if n.Multihop > 1 {
			p.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(n.Multihop)}
		}
		for _, name := range n.Families {
			f := Family(name)
			p.AfiSafis = append(p.AfiSafis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: apiFamily(f), Enabled: true},
				PrefixLimits: &api.PrefixLimit{Family: apiFamily(f), MaxPrefixes: maxReceived}})
		}
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: p}); err != nil {
			return fmt.Errorf("bgp: neighbor %s: %w", n.Address, err)
		}
	}
	s.log.Info("bgp: sessions configured", "local_as", c.LocalAS, "router_id", c.RouterID, "neighbors", len(c.Neighbors),
		"dry_run", c.DryRun)
	return nil
}

// stopLocked closes the sessions (a Cease: the peers drop our routes).
// The announcements stay, to be announced again by the next start.
func (s *Speaker) stopLocked(ctx context.Context) {
	if s.srv == nil || !s.started {
		return
	}
	for _, e := range s.anns {
		if e.uuid != nil {
			s.srv.DeletePath(ctx, &api.DeletePathRequest{Uuid: e.uuid})
			e.uuid = nil
		}
	}
	if err := s.srv.StopBgp(ctx, &api.StopBgpRequest{}); err != nil {
		s.log.Error("bgp: stop", "err", err)
	}
	s.started = false
}

// Close closes the sessions: the peers withdraw every route of ours.
// The announcements are kept for Save.
func (s *Speaker) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.stopLocked(ctx)
	for _, e := range s.anns {
		if e.State == StateAnnounced {
			e.State = StateDryRun
		}
	}
}

func (s *Speaker) idsLocked() []uint64 {
	ids := make([]uint64, 0, len(s.anns))
	for id := range s.anns {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// guardLocked says why the guards refuse a (empty: they do not); self is
// its own id when it is already held.
func (s *Speaker) guardLocked(a Announcement, self uint64) string {
	c := s.cfg
	var check []netip.Prefix
	switch a.Kind {
	case Blackhole:
		check = append(check, a.Prefix)
	case FlowSpec:
		if a.Match == nil || !a.Match.Dst.IsValid() {
			return "a FlowSpec rule needs a destination"
		}
		check = append(check, a.Match.Dst)
		if a.Match.Src.IsValid() {
			check = append(check, a.Match.Src)
		}
	default:
		return fmt.Sprintf("unknown kind %q", a.Kind)
	}
	p := check[0]
	if p.Addr().Is4() && p.Bits() < c.Width4 || p.Addr().Is6() && p.Bits() < c.Width6 {
		return fmt.Sprintf("%s is wider than the allowed /%d (IPv4) and /%d (IPv6): bgp.widths", p, c.Width4, c.Width6)
	}
	fam := a.family()
	if !slices.ContainsFunc(c.Neighbors, func(n policy.BGPNeighbor) bool { return slices.Contains(n.Families, string(fam)) }) {
		return fmt.Sprintf("no neighbor carries %s", fam)
	}
	for _, q := range check {
		for _, g := range c.Guards {
			if q.Overlaps(g.Prefix) {
				return fmt.Sprintf("%s overlaps %s (%s)", q, g.Prefix, g.Why)
			}
		}
	}
	n := 0
	for id := range s.anns {
		if id != self {
			n++
		}
	}
	if self == 0 && n >= c.MaxAnnouncements {
		return fmt.Sprintf("%d announcements already, at most %d: bgp.max_announcements", n, c.MaxAnnouncements)
	}
	return ""
}

// syncLocked puts e into GoBGP's table, or takes it out, as dry run
// says.
func (s *Speaker) syncLocked(e *entry, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch {
	case s.cfg.DryRun && e.uuid != nil:
		if err := s.srv.DeletePath(ctx, &api.DeletePathRequest{Uuid: e.uuid}); err != nil {
			s.log.Error("bgp: withdraw for dry run", "id", e.ID, "err", err)
		}
		e.uuid = nil
		e.State = StateDryRun
		s.log.Info("bgp: dry run: withdrawn, kept listed", "id", e.ID, "route", e.Route())
	case s.cfg.DryRun:
		e.State = StateDryRun
	case e.uuid == nil && s.started:
		p, err := e.path(s.cfg.Community)
		var r *api.AddPathResponse
		if err == nil {
			r, err = s.srv.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: p})
		}
		if err != nil {
			e.State, e.Error = StateFailed, err.Error()
			s.event(OpFail, e.Announcement, "GoBGP refused the path", now, err)
			return
		}
		e.uuid, e.State, e.Error = r.Uuid, StateAnnounced, ""
	case e.uuid == nil:
		e.State, e.Error = StateFailed, "the BGP sessions are not started"
	}
}

func (s *Speaker) event(op Op, a Announcement, why string, now time.Time, err error) {
	s.counts[op]++
	ev := Event{Op: op, Announcement: a, Why: why, At: now}
	attrs := []any{"op", op, "id", a.ID, "kind", a.Kind, "route", a.Route(), "action", a.ActionString(s.cfg.Community),
		"origin", a.Origin, "reason", a.Reason, "expires", a.Expires.Format(time.RFC3339), "state", a.State, "why", why}
	if a.By != "" {
		attrs = append(attrs, "by", a.By)
	}
	switch {
	case err != nil:
		ev.Err = err.Error()
		s.log.Error("bgp", append(attrs, "err", err)...)
	case op == OpRenew:
		s.log.Debug("bgp", attrs...)
	case a.State == StateDryRun && op == OpAnnounce:
		s.log.Info("bgp: dry run: would announce", attrs...)
	default:
		s.log.Info("bgp", attrs...)
	}
	s.audit(ev)
}

// Announce adds an announcement (or renews the one with the same route:
// its expiry becomes the later of the two). A guard's refusal wraps
// ErrRefused.
func (s *Speaker) Announce(a Announcement, now time.Time) (Announcement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.Match != nil {
		m := *a.Match
		a.Match = &m
	}
	for _, e := range s.anns {
		if e.key() == a.key() {
			if a.Expires.After(e.Expires) {
				e.Expires = a.Expires
			}
			if a.Ref != "" {
				e.Ref = a.Ref
			}
			s.event(OpRenew, e.Announcement, a.Reason, now, nil)
			return e.Announcement, nil
		}
	}
	if why := s.guardLocked(a, 0); why != "" {
		a.State = "refused"
		s.refused[guardName(why)]++
		s.event(OpRefuse, a, why, now, nil)
		return a, fmt.Errorf("bgp: %s %s: %w: %s", a.Kind, a.Route(), ErrRefused, why)
	}
	a.ID = s.nextID
	s.nextID++
	a.Since = now
	e := &entry{Announcement: a}
	s.anns[a.ID] = e
	s.syncLocked(e, now)
	if e.State != StateFailed {
		s.event(OpAnnounce, e.Announcement, a.Reason, now, nil)
	}
	return e.Announcement, nil
}

// guardName is the metric label of a refusal.
func guardName(why string) string {
	switch {
	case strings.Contains(why, "bgp.widths"):
		return "width"
	case strings.Contains(why, "max_announcements"):
		return "max"
	case strings.Contains(why, "overlaps"):
		return "forbidden"
	case strings.Contains(why, "no neighbor"):
		return "family"
	}
	return "other"
}

func (s *Speaker) withdrawLocked(e *entry, why string, now time.Time) {
	if e.uuid != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.DeletePath(ctx, &api.DeletePathRequest{Uuid: e.uuid}); err != nil {
			s.log.Error("bgp: withdraw", "id", e.ID, "err", err)
		}
		e.uuid = nil
	}
	delete(s.anns, e.ID)
	s.event(OpWithdraw, e.Announcement, why, now, nil)
}

// Withdraw withdraws one announcement.
func (s *Speaker) Withdraw(id uint64, why string, now time.Time) (Announcement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.anns[id]
	if !ok {
		return Announcement{}, fmt.Errorf("bgp: announcement %d: %w", id, ErrNotFound)
	}
	s.withdrawLocked(e, why, now)
	return e.Announcement, nil
}

// WithdrawRef withdraws the announcements that follow ref; it returns
// how many.
func (s *Speaker) WithdrawRef(ref, why string, now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range s.idsLocked() {
		if e := s.anns[id]; e.Ref == ref {
			s.withdrawLocked(e, why, now)
			n++
		}
	}
	return n
}

// Renew moves the expiry of the announcements that follow ref.
// It returns how many there are.
func (s *Speaker) Renew(ref string, expires time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.anns {
		if e.Ref == ref {
			n++
			if expires.After(e.Expires) {
				e.Expires = expires
			}
		}
	}
	return n
}

// Expire withdraws the announcements whose time is up, and retries
// failed ones.
func (s *Speaker) Expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.idsLocked() {
		e := s.anns[id]
		if !e.Expires.After(now) {
			s.withdrawLocked(e, "expired (ttl)", now)
		} else if e.State == StateFailed {
			s.syncLocked(e, now)
		}
	}
}

// List are the announcements, oldest first.
func (s *Speaker) List() []Announcement {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Announcement{}
	for _, id := range s.idsLocked() {
		out = append(out, s.anns[id].Announcement)
	}
	return out
}

// Config is the configuration in force.
func (s *Speaker) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Counts are the events so far, by operation, and the refusals by guard.
func (s *Speaker) Counts() (map[Op]uint64, map[string]uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ops, ref := map[Op]uint64{}, map[string]uint64{}
	for k, v := range s.counts {
		ops[k] = v
	}
	for k, v := range s.refused {
		ref[k] = v
	}
	return ops, ref
}

// Peer is one session's state.
type Peer struct {
	Address  string    `json:"address"`
	AS       uint32    `json:"as"`
	State    string    `json:"state"` // idle, connect, active, opensent, openconfirm, established
	Uptime   time.Time `json:"uptime,omitzero"`
	Families []Family  `json:"families"`
	// Received are the routes the peer sent us (every family); Accepted
	// those in the speaker's table: 0, it rejects them all.
	Received, Accepted uint64
}

// Peers are the sessions' states.
func (s *Speaker) Peers(ctx context.Context) []Peer {
	s.mu.Lock()
	srv, started, cfg := s.srv, s.started, s.cfg
	s.mu.Unlock()
	out := []Peer{}
	state := map[string]*api.Peer{}
	if srv != nil && started {
		srv.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) { state[p.GetConf().GetNeighborAddress()] = p })
	}
	for _, n := range cfg.Neighbors {
		p := Peer{Address: n.Address.String(), AS: n.AS, State: "down"}
		for _, f := range n.Families {
			p.Families = append(p.Families, Family(f))
		}
		if ap, ok := state[p.Address]; ok {
			p.State = sessionState(ap.GetState().GetSessionState())
			for _, af := range ap.GetAfiSafis() {
				p.Received += af.GetState().GetReceived()
			}
			if p.State == "established" && ap.GetTimers().GetState().GetUptime() != nil {
				p.Uptime = ap.GetTimers().GetState().GetUptime().AsTime()
			}
		}
		out = append(out, p)
	}
	if srv == nil || !started {
		return out
	}
	// What the global table holds from each peer (the import policy
	// rejects everything: none).
	for _, f := range Families {
		srv.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: apiFamily(f)}, func(d *api.Destination) {
			for _, path := range d.GetPaths() {
				for i := range out {
					if path.GetNeighborIp() == out[i].Address {
						out[i].Accepted++
					}
				}
			}
		})
	}
	return out
}

func sessionState(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_IDLE:
		return "idle"
	case api.PeerState_CONNECT:
		return "connect"
	case api.PeerState_ACTIVE:
		return "active"
	case api.PeerState_OPENSENT:
		return "opensent"
	case api.PeerState_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_ESTABLISHED:
		return "established"
	}
	return "unknown"
}

// saved is the state file's content.
type saved struct {
	NextID        uint64         `json:"next_id"`
	Announcements []Announcement `json:"announcements"`
}

// Save is the announcements as JSON (the daemon keeps them in its state
// directory: a restarted daemon announces them again until they expire).
func (s *Speaker) Save() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv := saved{NextID: s.nextID, Announcements: []Announcement{}}
	for _, id := range s.idsLocked() {
		sv.Announcements = append(sv.Announcements, s.anns[id].Announcement)
	}
	return json.Marshal(sv)
}

// Load takes back saved announcements that have not expired; the next
// Configure announces them (guards checked again). It returns how many.
func (s *Speaker) Load(data []byte, now time.Time) (int, error) {
	var sv saved
	if err := json.Unmarshal(data, &sv); err != nil {
		return 0, fmt.Errorf("bgp: saved announcements: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range sv.Announcements {
		if a.ID == 0 || !a.Expires.After(now) || s.anns[a.ID] != nil {
			continue
		}
		if a.Kind == Blackhole && !a.Prefix.IsValid() || a.Kind == FlowSpec && (a.Match == nil || !a.Match.Dst.IsValid()) ||
			a.Kind != Blackhole && a.Kind != FlowSpec {
			return n, fmt.Errorf("bgp: saved announcement %d: not a blackhole or FlowSpec route", a.ID)
		}
		a.State = StateDryRun
		s.anns[a.ID] = &entry{Announcement: a}
		s.nextID = max(s.nextID, a.ID+1)
		n++
	}
	s.nextID = max(s.nextID, sv.NextID)
	return n, nil
}

// gobgpLogger hands GoBGP's log to slog at its levels (info: a peer's
// state changes, once each); panic and fatal are errors here.
type gobgpLogger struct{ log *slog.Logger }

func attrsOf(f gobgplog.Fields) []any {
	out := make([]any, 0, 2*len(f))
	for k, v := range f {
		out = append(out, k, v)
	}
	return out
}

func (l *gobgpLogger) Panic(msg string, f gobgplog.Fields) { l.log.Error(msg, attrsOf(f)...) }
func (l *gobgpLogger) Fatal(msg string, f gobgplog.Fields) { l.log.Error(msg, attrsOf(f)...) }
func (l *gobgpLogger) Error(msg string, f gobgplog.Fields) { l.log.Error(msg, attrsOf(f)...) }
func (l *gobgpLogger) Warn(msg string, f gobgplog.Fields)  { l.log.Warn(msg, attrsOf(f)...) }
func (l *gobgpLogger) Info(msg string, f gobgplog.Fields)  { l.log.Info(msg, attrsOf(f)...) }
func (l *gobgpLogger) Debug(msg string, f gobgplog.Fields) { l.log.Debug(msg, attrsOf(f)...) }
func (l *gobgpLogger) SetLevel(gobgplog.LogLevel)          {}
func (l *gobgpLogger) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }
