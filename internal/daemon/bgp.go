package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/bgp"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/shield"
)

// The BGP speaker as the daemon runs it (docs/bgp.md): it follows the
// policy's bgp: section, announces the shield's enforced fingerprints as
// FlowSpec rules and a blackhole for the host's destinations while the
// offered rate is above the uplink's fraction, withdraws on expiry, keeps
// its announcements in the state directory (a restarted daemon announces
// again what has not expired) and appends every change to an audit file.
const (
	bgpStateFile = "bgp-announcements.json"
	bgpAuditFile = "bgp-audit.jsonl"
	bgpAuditMax  = 16 << 20
)

// bgpRun is the daemon's side of the speaker: it owns the speaker, its
// loop (run) and its state files, follows each committed generation
// (follow) and the shield's fingerprint actions (shieldChange).
type bgpRun struct {
	log       *slog.Logger
	statePath func(name string) string                                   // "" without a state directory
	readState func(name string, decode func([]byte) error) (bool, error) // Daemon.readStateFile
	// offered is the host's offered rate, bytes per second (the
	// counters' history), for the automatic blackhole.
	offered func() (float64, bool)
	// shieldActions are the shield's actions in force (nil: it is off),
	// which a fresh speaker announces.
	shieldActions func() []shield.Action

	// turn serializes the speaker's configuration: by a committed
	// generation (follow, the apply path) and by a password file's
	// change (tick, the speaker's loop). Taken before mu.
	turn sync.Mutex

	mu          sync.Mutex  // guards what follows
	want        *policy.BGP // the section the last committed generation asks for (nil: none)
	wantG       []policy.BGPGuard
	behind      bool // want is not in force: a password file did not read (tick retries)
	sp          *bgp.Speaker
	pol         *policy.BGP // the section the speaker runs
	guards      []policy.BGPGuard
	pwds        []string
	err         string  // why the configured speaker does not run
	lastOffered float64 // bytes per second, last reading
	// uplinkRefused are destinations a guard refused while the offered
	// rate is above the threshold: asked once per episode, not each
	// second (one refusal in the log and the audit file). the loop's alone.
	uplinkRefused map[netip.Prefix]bool
	// asked are the shield actions already turned into announcements
	// (or refused): a renewal of one not asked yet is announced (the
	// speaker started, or flowspec.auto was turned on, after its
	// install). Guarded by mu.
	asked map[string]bool
	saved []byte

	auditMu sync.Mutex
	audits  atomic.Uint64 // audit records that could not be written
}

func newBGPRun(log *slog.Logger, statePath func(string) string, readState func(string, func([]byte) error) (bool, error),
	offered func() (float64, bool), shieldActions func() []shield.Action) *bgpRun {
	return &bgpRun{log: log, statePath: statePath, readState: readState, offered: offered, shieldActions: shieldActions}
}

func (b *bgpRun) get() (*bgp.Speaker, *policy.BGP) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sp, b.pol
}

// run runs the speaker's loop once a second: expiry, the automatic
// blackhole, saving, and the neighbors' password files (a changed one is
// picked up live, docs/bgp.md). Which section the speaker runs is the
// subscriber's (follow). It closes the speaker when the daemon stops.
func (b *bgpRun) run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	defer b.stop()
	for {
		b.tick(ctx, time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (b *bgpRun) tick(ctx context.Context, now time.Time) {
	b.passwords(ctx, now)
	sp, p := b.get()
	if sp == nil {
		return
	}
	sp.Expire(now)
	b.uplink(sp, p, now)
	b.save(false)
}

// follow is the BGP speaker's subscriber (subscribers.go): it starts,
// reconfigures or closes the speaker for a committed generation's bgp:
// section. A password file that does not read leaves the speaker as it
// was (its sessions and section) and says why; tick retries it each
// second.
func (b *bgpRun) follow(ctx context.Context, c committed) error {
	b.turn.Lock()
	defer b.turn.Unlock()
	var want *policy.BGP
	var guards []policy.BGPGuard
	if c.run.pol.BGP != nil {
		want, guards = c.run.pol.BGP, c.run.pol.BGPGuarded()
	}
	b.mu.Lock()
	b.want, b.wantG = want, guards
	b.mu.Unlock()
	return b.sync(ctx, c.at, false)
}

// passwords re-reads the running section's password files and
// reconfigures the speaker when one changed, or when the last committed
// section is not in force yet (its password file did not read).
func (b *bgpRun) passwords(ctx context.Context, now time.Time) {
	b.turn.Lock()
	defer b.turn.Unlock()
	b.mu.Lock()
	want, behind, have := b.want, b.behind, b.pwds
	b.mu.Unlock()
	if want == nil {
		return
	}
	if !behind {
		pwds, err := readBGPPasswords(want)
		if err == nil && slices.Equal(pwds, have) {
			return
		}
	}
	b.sync(ctx, now, true)
}

// sync brings the speaker to b.want: closed without a section,
// configured when the section, its guards or its passwords differ from
// what runs (or always with force). Caller holds b.turn.
func (b *bgpRun) sync(ctx context.Context, now time.Time, force bool) error {
	b.mu.Lock()
	want, guards, sp := b.want, b.wantG, b.sp
	same := reflect.DeepEqual(b.pol, want) && reflect.DeepEqual(b.guards, guards)
	have := b.pwds
	b.mu.Unlock()
	if want == nil {
		b.stop()
		b.mu.Lock()
		b.err, b.behind = "", false
		b.mu.Unlock()
		return nil
	}
	pwds, err := readBGPPasswords(want)
	if err != nil {
		b.mu.Lock()
		logIt := b.err != err.Error()
		b.err, b.behind = err.Error(), true
		b.mu.Unlock()
		if logIt {
			b.log.Error("bgp: not (re)configured", "err", err)
		}
		if sp != nil {
			return fmt.Errorf("not reconfigured, the speaker runs its earlier section: %w", err)
		}
		return fmt.Errorf("not started, nothing is announced: %w", err)
	}
	if !force && sp != nil && same && slices.Equal(pwds, have) {
		b.mu.Lock()
		b.pol, b.guards = want, guards // the same section, of the new generation
		b.mu.Unlock()
		return nil
	}
	return b.configure(ctx, sp, want, guards, pwds, now)
}

// configure starts the speaker or applies a changed section.
func (b *bgpRun) configure(ctx context.Context, sp *bgp.Speaker, want *policy.BGP, guards []policy.BGPGuard, pwds []string,
	now time.Time) error {
	fresh := sp == nil
	if fresh {
		sp = bgp.New(bgp.Options{Logger: b.log.With("component", "bgp"), Audit: b.audit})
		if _, err := b.readState(bgpStateFile, func(data []byte) error {
			n, err := sp.Load(data, now)
			if n > 0 {
				b.log.Info("bgp: announcements from before the restart, announced again until they expire", "count", n,
					"file", b.statePath(bgpStateFile))
			}
			return err
		}); err != nil {
			b.log.Error("bgp: saved announcements not read; starting without them", "err", err)
		}
	}
	cfg := bgp.Config{BGP: *want, Passwords: pwds, Guards: guards}
	err := sp.Configure(ctx, cfg)
	b.mu.Lock()
	b.sp, b.pol, b.guards, b.pwds = sp, want, guards, pwds
	b.err, b.behind = "", false
	if err != nil {
		b.err = err.Error()
	}
	b.mu.Unlock()
	if err != nil {
		b.log.Error("bgp: sessions not started: nothing is announced", "err", err)
		err = fmt.Errorf("sessions not started, nothing is announced: %w", err)
	}
	if fresh {
		// The shield's fingerprints in force before the speaker ran
		// (a bgp: section added to a running policy, or a start that
		// adopted a crashed daemon's fingerprints) are announced too;
		// without b.mu, which shieldChange takes (it ran deferred
		// under b.mu before, and a fresh speaker beside an enforced
		// fingerprint waited on itself).
		b.adoptShield(now)
	}
	return err
}

// adoptShield announces the shield's enforced fingerprint actions as
// if they were just installed (the same routes renew, not duplicate).
func (b *bgpRun) adoptShield(now time.Time) {
	for _, a := range b.shieldActions() {
		if a.Expires.After(now) {
			b.shieldChange(shield.Change{Op: shield.OpInstall, Action: a, Why: "in force when the BGP speaker started", By: "shield", At: now})
		}
	}
}

// readBGPPasswords reads each neighbor's password file ("" without one).
func readBGPPasswords(p *policy.BGP) ([]string, error) {
	out := make([]string, len(p.Neighbors))
	for i, n := range p.Neighbors {
		if n.PasswordFile == "" {
			continue
		}
		raw, err := os.ReadFile(n.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("bgp neighbor %s password_file: %w", n.Address, err)
		}
		pw := strings.TrimRight(string(raw), "\r\n")
		if pw == "" || len(pw) > 80 {
			return nil, fmt.Errorf("bgp neighbor %s password_file %s: want 1 to 80 bytes (TCP MD5 keys are at most 80)", n.Address, n.PasswordFile)
		}
		out[i] = pw
	}
	return out, nil
}

// stop closes the sessions (the peers withdraw our routes) and saves
// the announcements for the next start.
func (b *bgpRun) stop() {
	b.mu.Lock()
	sp := b.sp
	b.mu.Unlock()
	if sp == nil {
		return
	}
	b.save(true)
	sp.Close()
	b.mu.Lock()
	b.sp, b.pol, b.guards, b.pwds, b.asked, b.behind = nil, nil, nil, nil, nil, false
	b.mu.Unlock()
	b.log.Info("bgp: sessions closed; the peers withdraw our routes")
}

// save writes the announcements when they changed (atomically).
func (b *bgpRun) save(force bool) {
	sp, _ := b.get()
	path := b.statePath(bgpStateFile)
	if sp == nil || path == "" {
		return
	}
	data, err := sp.Save()
	if err != nil {
		b.log.Error("bgp: save announcements", "err", err)
		return
	}
	b.mu.Lock()
	same := bytes.Equal(data, b.saved)
	b.mu.Unlock()
	if same && !force {
		return
	}
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		b.log.Error("bgp: save announcements", "file", path, "err", err)
		return
	}
	b.mu.Lock()
	b.saved = data
	b.mu.Unlock()
}

// uplink announces (or renews) a blackhole of each destination while
// the offered rate is above uplink x fraction: the link is full before
// the NIC, and only the upstream can drop it.
func (b *bgpRun) uplink(sp *bgp.Speaker, p *policy.BGP, now time.Time) {
	rate, ok := b.offered()
	b.mu.Lock()
	b.lastOffered = rate
	b.mu.Unlock()
	if !ok || p.Uplink.IsZero() {
		return
	}
	limit := p.Uplink.PerSecond() * p.Fraction
	if rate <= limit {
		b.uplinkRefused = nil
		return
	}
	for _, dst := range p.Destinations {
		if b.uplinkRefused[dst] {
			continue
		}
		a := bgp.Announcement{Kind: bgp.Blackhole, Prefix: dst, Origin: "uplink", Ref: "uplink",
			Reason:  fmt.Sprintf("offered %.0f bit/s > %.0f bit/s (%g of the uplink)", rate*8, limit*8, p.Fraction),
			Expires: now.Add(p.BlackholeTTL)}
		if _, err := sp.Announce(a, now); errors.Is(err, bgp.ErrRefused) { // logged, audited and counted
			if b.uplinkRefused == nil {
				b.uplinkRefused = map[netip.Prefix]bool{}
			}
			b.uplinkRefused[dst] = true
		}
	}
}

// shieldChange follows the shield's enforced fingerprint actions with
// FlowSpec rules for the host's destinations: announced at install,
// renewed with them, withdrawn at their removal (or their expiry, the
// same TTL).
func (b *bgpRun) shieldChange(c shield.Change) {
	a := c.Action
	if a.Kind != shield.FingerprintRule || a.Fingerprint == nil || !a.Enforced {
		return
	}
	sp, p := b.get()
	if sp == nil || !p.FlowSpec {
		return
	}
	ref := fmt.Sprintf("shield action %d", a.ID)
	b.mu.Lock()
	asked := b.asked[ref]
	switch {
	case c.Op == shield.OpRemove:
		delete(b.asked, ref)
	case b.asked == nil:
		b.asked = map[string]bool{ref: true}
	default:
		b.asked[ref] = true
	}
	b.mu.Unlock()
	switch c.Op {
	case shield.OpRemove:
		sp.WithdrawRef(ref, "shield action removed: "+c.Why, c.At)
		return
	case shield.OpRenew:
		if sp.Renew(ref, a.Expires) > 0 || asked {
			return
		}
	}
	ms, note, err := flowSpecMatches(*a.Fingerprint, p.Destinations)
	if err != nil {
		b.log.Warn("bgp: fingerprint not announced", "shield_action", a.ID, "fingerprint", a.Fingerprint.String(), "err", err)
		return
	}
	for _, m := range ms {
		ann := bgp.Announcement{Kind: bgp.FlowSpec, Match: &m, RateBytes: p.FlowSpecRate.PerSecond(), Origin: "shield",
			Ref: ref,
			Reason: fmt.Sprintf("shield action %d: %s surging at %.0f/s (baseline %.0f/s), fingerprint %s%s", a.ID, a.Key, a.Rate,
				a.Baseline, a.Fingerprint, note),
			Expires: a.Expires}
		sp.Announce(ann, c.At) // a refusal is logged, audited and counted
	}
}

// flowSpecMatches are a fingerprint's FlowSpec rules, one per
// destination (of the source prefix's family when it has one; like the
// data plane's fingerprint rule, one without a source matches both
// families). FlowSpec has no TTL component (RFC 8955): the rules match
// the other fields at every TTL (note says so); a fingerprint left with
// its protocol alone would match all of it and is refused.
func flowSpecMatches(fp shield.Fingerprint, dsts []netip.Prefix) ([]bgp.Match, string, error) {
	note := ""
	if fp.Mask&shield.FTTL != 0 {
		fp.Mask &^= shield.FTTL
		note = fmt.Sprintf(" (ttl %d not matched: FlowSpec has no TTL component)", fp.TTL)
	}
	if fp.Mask&^shield.FProto == 0 {
		return nil, "", errors.New("FlowSpec would match the whole protocol (it has no TTL component)")
	}
	var out []bgp.Match
	for _, dst := range dsts {
		if fp.Mask&shield.FSrc != 0 && fp.Src.Addr().Is4() != dst.Addr().Is4() {
			continue
		}
		m := bgp.Match{Dst: dst}
		if fp.Mask&shield.FProto != 0 {
			m.Proto = fp.Proto
		}
		if fp.Mask&shield.FDPort != 0 {
			m.DPort = fp.DPort
		}
		if fp.Mask&shield.FSPort != 0 {
			m.SPort = fp.SPort
		}
		if fp.Mask&shield.FLen != 0 {
			if dst.Addr().Is6() && fp.Len < 40 {
				continue // no IPv6 packet is that short
			}
			m.Len = fp.Len
		}
		if fp.Mask&shield.FTCPFlags != 0 {
			m.TCPFlags, m.HasTCPFlags = fp.TCPFlags, true
		}
		if fp.Mask&shield.FSrc != 0 {
			m.Src = fp.Src
		}
		out = append(out, m)
	}
	return out, note, nil
}

// audit appends an event to STATE_DIR/bgp-audit.jsonl (rotated to
// .1 at 16 MiB).
func (b *bgpRun) audit(ev bgp.Event) {
	path := b.statePath(bgpAuditFile)
	if path == "" {
		return
	}
	rotErr, err := appendAudit(&b.auditMu, path, bgpAuditMax, ev)
	if rotErr != nil {
		b.log.Error("bgp: rotate the audit file", "err", rotErr)
	}
	if err != nil {
		b.audits.Add(1)
		b.log.Error("bgp: append to the audit file", "file", path, "err", err)
	}
}

var errBGPOff = errors.New("the BGP speaker is off: the policy has no bgp: section")

// BGPReport is the answer of edgectl bgp list.
func (d *Daemon) BGPReport(ctx context.Context) control.BGPReport { return d.bgp.report(ctx) }

// report is edgectl bgp list's answer: the running section's, else the
// committed generation's.
func (b *bgpRun) report(ctx context.Context) control.BGPReport {
	b.mu.Lock()
	sp, p, errs, offered := b.sp, b.pol, b.err, b.lastOffered
	if p == nil {
		p = b.want
	}
	b.mu.Unlock()
	out := control.BGPReport{Peers: []control.BGPPeer{}, Announcements: []control.BGPAnnouncement{}, Destinations: []string{},
		Error: errs, OfferedBps: offered * 8}
	if p == nil {
		return out
	}
	out.Enabled, out.DryRun, out.LocalAS, out.RouterID = true, p.DryRun, p.LocalAS, p.RouterID.String()
	out.Community, out.MaxAnnouncements = bgp.FormatCommunity(p.Community), p.MaxAnnouncements
	for _, dst := range p.Destinations {
		out.Destinations = append(out.Destinations, dst.String())
	}
	if !p.Uplink.IsZero() {
		out.UplinkBps = p.Uplink.PerSecond() * p.Fraction * 8
	}
	if sp == nil {
		return out
	}
	for _, pr := range sp.Peers(ctx) {
		cp := control.BGPPeer{Address: pr.Address, AS: pr.AS, State: pr.State, Uptime: pr.Uptime, Received: pr.Received,
			Accepted: pr.Accepted}
		for _, f := range pr.Families {
			cp.Families = append(cp.Families, string(f))
		}
		out.Peers = append(out.Peers, cp)
	}
	out.Announcements = bgpAnnouncements(sp, p)
	return out
}

// bgpAnnouncements are the speaker's announcements as edgectl bgp list
// and edgectl show print them.
func bgpAnnouncements(sp *bgp.Speaker, p *policy.BGP) []control.BGPAnnouncement {
	out := []control.BGPAnnouncement{}
	for _, a := range sp.List() {
		out = append(out, control.BGPAnnouncement{ID: a.ID, Kind: string(a.Kind), Route: a.Route(),
			Action: a.ActionString(p.Community), Origin: a.Origin, Reason: a.Reason, By: a.By, Since: a.Since,
			Expires: a.Expires, State: a.State, Error: a.Error})
	}
	return out
}

// BGPDo announces a blackhole or withdraws announcements for an
// operator.
func (d *Daemon) BGPDo(verb string, req control.BGPRequest, by string) error {
	sp, p := d.bgp.get()
	if sp == nil {
		return errBGPOff
	}
	now := time.Now()
	switch verb {
	case "blackhole":
		pfx, err := policy.ParsePrefix(req.Prefix)
		if err != nil {
			a, aerr := netip.ParseAddr(req.Prefix)
			if aerr != nil || a.Zone() != "" {
				return fmt.Errorf("blackhole %q: want an address or a prefix: %w", req.Prefix, err)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		if pfx.Addr().Is4In6() {
			return fmt.Errorf("blackhole %s: an IPv4-mapped address: write the IPv4 address", pfx)
		}
		ttl := time.Duration(req.TTL)
		if ttl == 0 {
			ttl = p.BlackholeTTL
		}
		if ttl < time.Second || ttl > 7*24*time.Hour {
			return fmt.Errorf("blackhole --ttl %s: want 1s to 168h", ttl)
		}
		reason := req.Reason
		if reason == "" {
			reason = "operator"
		}
		_, err = sp.Announce(bgp.Announcement{Kind: bgp.Blackhole, Prefix: pfx, Origin: "cli", Reason: fmt.Sprintf("%.200s", reason),
			By: by, Expires: now.Add(ttl)}, now)
		return err
	case "flowspec":
		ann, err := flowSpecRequest(req, p, by, now)
		if err != nil {
			return err
		}
		_, err = sp.Announce(ann, now)
		return err
	case "withdraw":
		switch {
		case req.All:
			for _, a := range sp.List() {
				sp.Withdraw(a.ID, "withdrawn by "+by, now)
			}
		case req.ID != 0:
			if _, err := sp.Withdraw(req.ID, "withdrawn by "+by, now); err != nil {
				return err
			}
		default:
			return errors.New("withdraw: name an announcement id or all")
		}
		return nil
	}
	return fmt.Errorf("unknown bgp request %q", verb)
}

// flowSpecRequest is an operator's FlowSpec rule as an announcement.
func flowSpecRequest(req control.BGPRequest, p *policy.BGP, by string, now time.Time) (bgp.Announcement, error) {
	f := req.FlowSpec
	if f == nil {
		return bgp.Announcement{}, errors.New("flowspec: no rule in the request")
	}
	prefix := func(what, s string) (netip.Prefix, error) {
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" && !a.Is4In6() {
			return netip.PrefixFrom(a, a.BitLen()), nil
		}
		q, err := policy.ParsePrefix(s)
		if err != nil || q.Addr().Is4In6() {
			return netip.Prefix{}, fmt.Errorf("flowspec %s %q: want an address or a prefix (no IPv4-mapped IPv6)", what, s)
		}
		return q, nil
	}
	var m bgp.Match
	var err error
	if m.Dst, err = prefix("--dst", f.Dst); err != nil {
		return bgp.Announcement{}, err
	}
	if f.Src != "" {
		if m.Src, err = prefix("--src", f.Src); err != nil {
			return bgp.Announcement{}, err
		}
		if m.Src.Addr().Is4() != m.Dst.Addr().Is4() {
			return bgp.Announcement{}, fmt.Errorf("flowspec: --src %s and --dst %s are of different families", m.Src, m.Dst)
		}
	}
	if f.Proto != "" {
		n, ok := shield.ParseProto(f.Proto)
		if !ok || n == 0 {
			return bgp.Announcement{}, fmt.Errorf("flowspec --proto %q: want tcp, udp, icmp, icmpv6 or 1 to 255", f.Proto)
		}
		m.Proto = n
	}
	if (f.DPort != 0 || f.SPort != 0) && m.Proto != 6 && m.Proto != 17 {
		return bgp.Announcement{}, errors.New("flowspec: ports need --proto tcp or udp")
	}
	m.DPort, m.SPort = f.DPort, f.SPort
	if f.Length != 0 {
		if m.Dst.Addr().Is6() && f.Length < 40 {
			return bgp.Announcement{}, fmt.Errorf("flowspec --length %d: an IPv6 packet is at least 40 bytes", f.Length)
		}
		m.Len = f.Length
	}
	if f.TCPFlags != "" {
		if m.Proto != 6 {
			return bgp.Announcement{}, errors.New("flowspec: --tcp-flags needs --proto tcp")
		}
		v, err := strconv.ParseUint(f.TCPFlags, 0, 8)
		if err != nil {
			return bgp.Announcement{}, fmt.Errorf("flowspec --tcp-flags %q: want a byte like 0x02 (SYN) or 0x12 (SYN+ACK)", f.TCPFlags)
		}
		m.TCPFlags, m.HasTCPFlags = uint8(v), true
	}
	if !bgp.ValidFragment(f.Fragment) {
		return bgp.Announcement{}, fmt.Errorf("flowspec --fragment %q: want not-a-fragment, is-fragment, first-fragment, last-fragment or dont-fragment", f.Fragment)
	}
	m.Fragment = f.Fragment
	var rate float64
	if f.Rate != "" {
		r, u, err := policy.ParseRate(f.Rate)
		if err != nil || u != policy.Bytes || r.PerSecond() < 1 || r.PerSecond() > 1e13 {
			return bgp.Announcement{}, fmt.Errorf("flowspec --rate %q: want bits or bytes per second, like 1MB/s or 10Mbit/s (8bit/s to 80Tbit/s)", f.Rate)
		}
		rate = r.PerSecond()
	}
	ttl := time.Duration(req.TTL)
	if ttl == 0 {
		ttl = p.BlackholeTTL
	}
	if ttl < time.Second || ttl > 7*24*time.Hour {
		return bgp.Announcement{}, fmt.Errorf("flowspec --ttl %s: want 1s to 168h", ttl)
	}
	reason := req.Reason
	if reason == "" {
		reason = "operator"
	}
	return bgp.Announcement{Kind: bgp.FlowSpec, Match: &m, RateBytes: rate, Origin: "cli", Reason: fmt.Sprintf("%.200s", reason),
		By: by, Expires: now.Add(ttl)}, nil
}

// bgpRoutes adds the speaker's endpoints to the control API.
func (d *Daemon) bgpRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/bgp", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, d.BGPReport(r.Context()))
	})
	for _, verb := range []string{"blackhole", "flowspec", "withdraw"} {
		mux.Handle("POST /v1/bgp/"+verb, d.rootOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req control.BGPRequest
			if !decodeBody(w, r, maxSmallBody, "bgp request", &req) {
				return
			}
			uid, _ := r.Context().Value(peerUIDKey{}).(int)
			by := fmt.Sprintf("uid %d", uid)
			if req.By != "" {
				by = fmt.Sprintf("%.64s (uid %d)", req.By, uid)
			}
			if err := d.BGPDo(verb, req, by); err != nil {
				status := http.StatusUnprocessableEntity
				switch {
				case errors.Is(err, bgp.ErrNotFound):
					status = http.StatusNotFound
				case errors.Is(err, bgp.ErrRefused):
					status = http.StatusForbidden
				}
				writeError(w, status, err)
				return
			}
			d.bgp.save(false)
			writeJSON(w, d.BGPReport(r.Context()))
		})))
	}
}

// bgpCollector exports the speaker's metrics.
type bgpCollector struct {
	d                                     *Daemon
	up, sessions, anns, events, refused   *prometheus.Desc
	offered, threshold, auditFail, dryRun *prometheus.Desc
}

func newBGPCollector(d *Daemon) prometheus.Collector {
	return &bgpCollector{
		d:  d,
		up: prometheus.NewDesc("edgeguard_bgp_configured", "1 when the policy has a bgp: section and its speaker runs.", nil, nil),
		sessions: prometheus.NewDesc("edgeguard_bgp_sessions",
			"BGP sessions by state (established, active, connect, idle, ...).", []string{"state"}, nil),
		anns: prometheus.NewDesc("edgeguard_bgp_announcements",
			"Announcements held, by kind (blackhole, flowspec) and state (announced, dry-run, failed).", []string{"kind", "state"}, nil),
		events: prometheus.NewDesc("edgeguard_bgp_events_total",
			"Announcement changes by operation (announce, renew, withdraw, refuse, fail).", []string{"op"}, nil),
		refused: prometheus.NewDesc("edgeguard_bgp_refused_total",
			"Announcements a guard refused, by guard (forbidden, width, max, family).", []string{"guard"}, nil),
		offered: prometheus.NewDesc("edgeguard_bgp_offered_bits_per_second",
			"The host's offered rate as the automatic blackhole judges it (every packet the data plane saw).", nil, nil),
		threshold: prometheus.NewDesc("edgeguard_bgp_blackhole_threshold_bits_per_second",
			"bgp.uplink.rate x bgp.uplink.fraction: above it the destinations are blackholed (0: no uplink set).", nil, nil),
		dryRun: prometheus.NewDesc("edgeguard_bgp_dry_run", "1 while bgp.dry_run is true: nothing is announced.", nil, nil),
		auditFail: prometheus.NewDesc("edgeguard_bgp_audit_failures_total",
			"BGP audit records that could not be written to the state directory.", nil, nil),
	}
}

func (c *bgpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.sessions, c.anns, c.events, c.refused, c.offered, c.threshold, c.dryRun, c.auditFail} {
		ch <- d
	}
}

func (c *bgpCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.d.bgp
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r := c.d.BGPReport(ctx)
	sp, _ := b.get()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	bool01 := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	gauge(c.up, bool01(sp != nil && r.Error == ""))
	gauge(c.dryRun, bool01(r.Enabled && r.DryRun))
	gauge(c.offered, r.OfferedBps)
	gauge(c.threshold, r.UplinkBps)
	ch <- prometheus.MustNewConstMetric(c.auditFail, prometheus.CounterValue, float64(b.audits.Load()))
	states := map[string]int{"established": 0}
	for _, p := range r.Peers {
		states[p.State]++
	}
	for s, n := range states {
		gauge(c.sessions, float64(n), s)
	}
	anns := map[[2]string]int{}
	for _, k := range []string{string(bgp.Blackhole), string(bgp.FlowSpec)} {
		for _, s := range []string{bgp.StateAnnounced, bgp.StateDryRun, bgp.StateFailed} {
			anns[[2]string{k, s}] = 0
		}
	}
	for _, a := range r.Announcements {
		anns[[2]string{a.Kind, a.State}]++
	}
	for k, n := range anns {
		gauge(c.anns, float64(n), k[0], k[1])
	}
	var ops map[bgp.Op]uint64
	var refused map[string]uint64
	if sp != nil {
		ops, refused = sp.Counts()
	}
	for _, op := range []bgp.Op{bgp.OpAnnounce, bgp.OpRenew, bgp.OpWithdraw, bgp.OpRefuse, bgp.OpFail} {
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(ops[op]), string(op))
	}
	for _, g := range []string{"forbidden", "width", "max", "family", "other"} {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(refused[g]), g)
	}
}
