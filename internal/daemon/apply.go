package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// apply makes next the running policy, all or nothing. Everything that can
// be checked is checked first (interfaces exist and carry no other XDP
// program, the L7 stage is ready and its address bound, the lists fit);
// then interfaces the policy gains are attached (they run the old policy
// for a moment; on a cold start, with no policy live, only after the new
// one is), the new generation goes live, the lists are written, and
// only then do status, the generation and GET /v1/policy change. A step
// that fails undoes the ones before it: the data plane, status, metrics
// and the running policy stay exactly as they were. Interfaces the policy
// dropped are detached last. Once committed, the generation is handed to
// its subscribers in their stated order (publish, subscribers.go); what
// they could not follow is in lastReload.Problems. Caller holds changeMu, not mu: d.mu is held
// only to read state and to commit (the flip, the lists, status), never
// while the new generation is written.
func (d *Daemon) apply(ctx context.Context, next running, trigger string) error {
	want := d.wantIfaces(next.pol)
	if len(want) == 0 {
		return errors.New("no interface to protect: list interfaces in the policy or pass --iface IFACE")
	}
	d.mu.Lock()
	have := make(map[string]*loader.Attachment, len(d.atts))
	for name, a := range d.atts {
		have[name] = a
	}
	d.mu.Unlock()
	var add, drop []string
	for name := range want {
		if _, ok := have[name]; !ok {
			add = append(add, name)
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			drop = append(drop, name)
		}
	}
	slices.Sort(add)
	slices.Sort(drop)
	for _, name := range add {
		if err := d.checkAttachable(name); err != nil {
			return err
		}
	}
	l7commit, l7abort, err := d.l7.prepare(ctx, &next)
	if err != nil {
		return err
	}
	type attached struct {
		a     *loader.Attachment
		taken bool
	}
	var added []attached
	undo := func() {
		for _, at := range added {
			if at.taken {
				at.a.Release()
			} else if err := at.a.Detach(); err != nil {
				d.log.Error("undo attach", "iface", at.a.Iface, "err", err)
			}
		}
		l7abort()
	}
	attachAll := func() error {
		for _, name := range add {
			a, taken, err := d.attach(name, want[name])
			if err != nil {
				return err
			}
			added = append(added, attached{a, taken})
		}
		return nil
	}
	// A change attaches the interfaces it adds before the new generation
	// goes live: they run the old policy for a moment, and a failed
	// attach leaves the running policy untouched. A cold start has no
	// policy live to run: there the program is attached only after its
	// policy is (below), or its first packets would pass as no_policy.
	cold := d.cur.pol == nil
	if !cold {
		if err := attachAll(); err != nil {
			undo()
			return err
		}
	}

	// Check before change: the lists must fit. Run-time entries change
	// under d.mu, so they are read again for the commit below.
	d.mu.Lock()
	_, err = d.fittingLists(next)
	d.mu.Unlock()
	if err != nil {
		undo()
		return err
	}
	// The slow part, off d.mu so status, stats and scrapes stay
	// answerable: the new generation is written to the inactive half of
	// the tables (changeMu keeps other writers of the generations out).
	staged, err := d.m.Generations.Stage(next.compiled)
	if err != nil {
		undo()
		return fmt.Errorf("apply policy: %w", err)
	}
	if d.staged != nil {
		d.staged()
	}

	// The commit, under d.mu: the flip, the lists, the daemon's state.
	d.mu.Lock()
	lists, err := d.fittingLists(next)
	if err == nil {
		if err = d.m.Generations.Commit(staged); err != nil {
			err = fmt.Errorf("apply policy: %w", err)
		} else if err = d.lists.store.Set(lists); err != nil {
			err = fmt.Errorf("write lists: %w", err)
			// Back to the running generation (Stage wrote only the other
			// half), and to the lists written last.
			if rerr := d.m.Generations.Revert(staged); rerr != nil {
				d.log.Error("roll back to the running policy's generation", "err", rerr)
			}
			if d.cur.pol != nil {
				if rerr := d.lists.sync(d.cur.pol); rerr != nil {
					d.log.Error("roll back the lists", "err", rerr)
				}
			}
		}
	}
	if err == nil && cold {
		if err = attachAll(); err != nil {
			// The start fails; pinned maps an earlier run left keep the
			// generation that run made live.
			if rerr := d.m.Generations.Revert(staged); rerr != nil {
				d.log.Error("roll back to the earlier run's generation", "err", rerr)
			}
		}
	}
	if err != nil {
		d.mu.Unlock()
		undo()
		return err
	}
	for _, at := range added {
		d.atts[at.a.Iface] = at.a
	}
	d.cur = next
	d.generation++
	d.lastReload = control.ReloadInfo{Time: time.Now(), OK: true, Trigger: trigger}
	d.reloads++
	gen, _ := d.m.Generations.Active()
	c := committed{seq: d.generation, run: next, at: time.Now(), l7commit: l7commit}
	d.mu.Unlock()

	// The subscribers follow the committed generation (subscribers.go):
	// the SYN path, the L7 stage, the shield, fleet mode, BGP. One that
	// fails does not undo the commit; it says so (status, metrics, log,
	// the apply's answer).
	problems := d.publish(ctx, c)
	for _, name := range drop {
		d.mu.Lock()
		a := d.atts[name]
		delete(d.atts, name)
		d.mu.Unlock()
		if err := a.Detach(); err != nil {
			d.log.Error("detach from an interface the policy dropped", "iface", name, "err", err)
			continue
		}
		d.log.Info("detached", "iface", name)
	}
	if len(drop) > 0 {
		d.mu.Lock()
		if err := d.syn.syncTC(d.atts); err != nil {
			d.log.Error("syn protection: tcx hand-off", "err", err)
		}
		d.mu.Unlock()
	}
	d.log.Info("policy applied", "policy", next.source, "generation", c.seq, "dataplane_generation", gen,
		"rules", len(next.compiled.Rules), "prefixes", len(next.compiled.Prefixes), "trigger", trigger,
		"problems", len(problems))
	for _, w := range next.compiled.Warnings {
		d.log.Warn("policy warning", "policy", next.source, "warning", w)
	}
	return nil
}

// fittingLists returns the lists trie entries next would run with (its
// lists and the run-time entries), or an error when they do not fit the
// table. Caller holds d.mu (expired run-time entries are dropped).
func (d *Daemon) fittingLists(next running) ([]maps.ListEntry, error) {
	lists, err := d.lists.entries(next.pol)
	if err != nil {
		return nil, err
	}
	if max := d.dp.Objects.Lists.MaxEntries(); uint32(len(lists)) > max {
		return nil, fmt.Errorf("lists need %d entries, the table holds %d: raise tables.list_entries", len(lists), max)
	}
	return lists, nil
}

// attach attaches to one interface, noting whether it took over a link an
// earlier run pinned (a failed start releases those instead of detaching).
func (d *Daemon) attach(name string, mode loader.Mode) (_ *loader.Attachment, taken bool, _ error) {
	a, err := d.dp.Attach(name, mode)
	if err != nil {
		return nil, false, err
	}
	d.log.Info("attached", "iface", name, "mode", a.Mode, "took_over", a.TookOver)
	return a, a.TookOver, nil
}

// linkPinPath is where the loader pins the link of an interface
// (PIN_DIR/links/IFACE, documented in docs/operations.md).
func linkPinPath(pinDir, iface string) string { return filepath.Join(pinDir, "links", iface) }

// checkAttachable fails, before anything changes, for an interface that
// does not exist or carries an XDP program that is not ours.
func (d *Daemon) checkAttachable(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return fmt.Errorf("interface %s: no such network interface (ip link show lists them)%s", name, d.renamedHint(name))
		}
		return fmt.Errorf("interface %s: %w", name, err)
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached || x.ProgId == 0 {
		return nil
	}
	if d.opts.PinDir != "" {
		if _, err := os.Stat(linkPinPath(d.opts.PinDir, name)); err == nil {
			return nil // our pinned link: Attach takes it over
		}
		if d.ourPinnedLinkOn(l.Attrs().Index) {
			return nil // ours, pinned under the interface's old name: Attach adopts it
		}
	}
	if info, err := d.dp.Objects.XdpLimiter.Info(); err == nil {
		if id, ok := info.ID(); ok && uint32(id) == x.ProgId {
			return nil
		}
	}
	return fmt.Errorf("interface %s: %w (program id %d, %s); Edgeguard never replaces it: "+
		"detach it first (ip link set dev %s xdp off, or its owner's tool), or chain both with a dispatcher such as libxdp",
		name, loader.ErrOtherProgram, x.ProgId, xdpAttachMode(x.AttachMode), name)
}

// xdpAttachMode names the kernel's XDP_ATTACHED_* values.
func xdpAttachMode(m uint32) string {
	switch m {
	case 1:
		return "native mode"
	case 2:
		return "generic mode"
	case 3:
		return "offloaded"
	case 4:
		return "several modes"
	}
	return fmt.Sprintf("attach mode %d", m)
}

// listen binds the metrics address and the control socket before anything
// is loaded, so a taken port or a socket another daemon serves fails the
// start with nothing touched.
func (d *Daemon) listen(next running) error {
	if addr := d.metricsAddr(next); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("metrics listen on %s: %w (metrics.listen in the policy, or --metrics-listen)", addr, err)
		}
		d.metricsLn = ln
	}
	if d.opts.Socket != "" {
		ln, err := listenControl(d.opts.Socket)
		if err != nil {
			return err
		}
		d.controlLn = ln
	}
	return nil
}

// unprotected lists the interfaces the daemon attached to that no longer
// carry its program: deleted, re-created under a new index, or with the
// program removed behind its back. Reads mu briefly, then netlink.
func (d *Daemon) unprotected() []string {
	var out []string
	for name, why := range d.unprotectedIfaces() {
		out = append(out, fmt.Sprintf("interface %s: %s: not protected", name, why))
	}
	slices.Sort(out)
	return out
}

// unprotectedIfaces says, per interface the policy names that does not
// carry the program now, why. Reads mu briefly, then netlink.
func (d *Daemon) unprotectedIfaces() map[string]string {
	d.mu.Lock()
	type att struct {
		name    string
		ifindex int // 0: not attached
	}
	var atts []att
	if d.cur.pol != nil {
		for name := range d.wantIfaces(d.cur.pol) {
			at := att{name: name}
			if a := d.atts[name]; a != nil {
				at.ifindex = a.Ifindex
			}
			atts = append(atts, at)
		}
	}
	d.mu.Unlock()
	var prog uint32
	if info, err := d.dp.Objects.XdpLimiter.Info(); err == nil {
		if id, ok := info.ID(); ok {
			prog = uint32(id)
		}
	}
	out := map[string]string{}
	for _, a := range atts {
		l, err := netlink.LinkByName(a.name)
		switch {
		case err != nil:
			out[a.name] = fmt.Sprintf("gone (%v)", err)
		case a.ifindex == 0:
			out[a.name] = "not attached"
		case l.Attrs().Index != a.ifindex:
			out[a.name] = fmt.Sprintf("re-created (ifindex %d, attached to %d)", l.Attrs().Index, a.ifindex)
		case l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached || (prog != 0 && l.Attrs().Xdp.ProgId != prog):
			out[a.name] = fmt.Sprintf("does not carry program %d", prog)
		}
	}
	return out
}

// Bounds of run-time list entries: wider prefixes need force (edgectl
// --force). A deny or allow of a /15 or wider IPv4 (/31 or wider IPv6)
// prefix covers more than an operator means by "this source"; 0.0.0.0/0
// would drop (or unlimit) everything at once.
const (
	minRuntimeBits4 = 16
	minRuntimeBits6 = 32
)

func checkWidth(kind control.ListKind, p netip.Prefix) error {
	min := minRuntimeBits6
	if p.Addr().Is4() {
		min = minRuntimeBits4
	}
	if p.Bits() < min {
		return fmt.Errorf("%s is wider than a /%d: a run-time %s entry that wide needs --force", p, min, kind)
	}
	return nil
}

// checkProtected refuses a deny that covers or falls inside one of the
// policy's lists.protected prefixes. Caller holds d.mu.
func (d *Daemon) checkProtected(p netip.Prefix) error {
	if d.cur.pol == nil {
		return nil
	}
	now := time.Now()
	for _, e := range d.cur.pol.Protected {
		if !e.Expires.IsZero() && !e.Expires.After(now) {
			continue
		}
		if e.Prefix.Overlaps(p) {
			return fmt.Errorf("%s overlaps the protected prefix %s (lists.protected, %s): denying it needs --force", p, e.Prefix, e.Source)
		}
	}
	return nil
}
