package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// watchLinks keeps the attachments on the interfaces the policy names when
// those are deleted and re-created (a driver reload, a VM's NIC hot-plug, a
// veth recreated by a container runtime): the old attachment is severed
// with its interface, so the new interface is attached afresh (state kept:
// the maps are the same). An interface that is gone is logged as an error
// and reported by /readyz and edgeguard_interfaces_unprotected until it
// returns. Netlink link events trigger a check at once; a check every 5 s
// covers a missed event (the subscription is best effort).
func (d *Daemon) watchLinks(ctx context.Context) error {
	events := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(events, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { d.log.Debug("link watch", "err", err) },
	}); err != nil {
		d.log.Warn("link watch: no netlink subscription; checking interfaces every 5s", "err", err)
		events = nil
	}
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	gone := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
		case <-t.C:
		}
		d.reattach(ctx, gone)
	}
}

// reattach re-attaches to wanted interfaces whose attachment no longer
// matches the interface of that name. gone remembers which were logged as
// missing, so each disappearance is logged once.
func (d *Daemon) reattach(ctx context.Context, gone map[string]bool) {
	d.changeMu.Lock()
	defer d.changeMu.Unlock()
	d.mu.Lock()
	want := d.wantIfaces(d.cur.pol)
	d.mu.Unlock()
	for name, mode := range want {
		d.mu.Lock()
		a := d.atts[name]
		d.mu.Unlock()
		l, err := netlink.LinkByName(name)
		if err != nil {
			if !gone[name] {
				gone[name] = true
				if a != nil {
					if nl, err := netlink.LinkByIndex(a.Ifindex); err == nil {
						d.log.Error("interface renamed: the program still runs on it under its new name, but the policy names the old one: "+
							"name the new one in the policy's interfaces (or --iface) and apply", "iface", name,
							"renamed_to", nl.Attrs().Name, "ifindex", a.Ifindex)
						continue
					}
				}
				d.log.Error("interface gone: not protected until it returns (re-attached then)", "iface", name, "err", err)
			}
			continue
		}
		if a != nil && a.Ifindex == l.Attrs().Index {
			continue
		}
		delete(gone, name)
		if a != nil {
			// Severed with the old interface: drop its pin and fd.
			if err := a.Detach(); err != nil {
				d.log.Warn("drop the severed attachment", "iface", name, "err", err)
			}
			d.mu.Lock()
			delete(d.atts, name)
			d.mu.Unlock()
		}
		if err := d.checkAttachable(name); err != nil {
			d.log.Error("interface re-created but not attachable: not protected", "iface", name, "err", err)
			continue
		}
		na, _, err := d.attach(name, mode)
		if err != nil {
			d.log.Error("interface re-created; re-attach failed: not protected", "iface", name, "err", err)
			continue
		}
		d.mu.Lock()
		d.atts[name] = na
		d.mu.Unlock()
		d.log.Warn("interface re-created: re-attached", "iface", name, "ifindex", na.Ifindex)
	}
}

// A renamed interface keeps its index, and so keeps the links an earlier
// run attached and pinned under its old name (loader.PinnedLinks). A start
// with a policy that names the new name adopts them (loader.Attach moves
// the pin: no moment without enforcement); one that still names the old
// name fails, saying where the link is now, and changes nothing. After a
// start, links pinned by an earlier run that no attachment took over are
// removed, each reported: severed ones (interface deleted) and ours on an
// interface the policy does not name. A pin that runs a program not ours
// is left alone.

// renamedHint is the end of a "no such network interface" error when the
// interface was renamed: where its pinned link is now.
func (d *Daemon) renamedHint(name string) string {
	pls, err := loader.PinnedLinks(d.opts.PinDir)
	if err != nil {
		return ""
	}
	for _, pl := range pls {
		if pl.Kind == "xdp" && pl.Name == name && pl.Iface != "" && pl.Iface != name && pl.Ours {
			return fmt.Sprintf("; it was renamed: the link pinned for %s is on %s (ifindex %d) and keeps enforcing there: "+
				"name %s in the policy's interfaces (or --iface %s)", name, pl.Iface, pl.Ifindex, pl.Iface, pl.Iface)
		}
	}
	return ""
}

// ourPinnedLinkOn reports whether an XDP link of ours pinned in the pin
// directory (under any name) is attached to ifindex.
func (d *Daemon) ourPinnedLinkOn(ifindex int) bool {
	pls, err := loader.PinnedLinks(d.opts.PinDir)
	if err != nil {
		return false
	}
	for _, pl := range pls {
		if pl.Kind == "xdp" && pl.Ifindex == ifindex && pl.Ours {
			return true
		}
	}
	return false
}

// tidyLinkPins removes, after a start, the links an earlier run pinned
// that this run did not take over. Caller holds d.mu.
func (d *Daemon) tidyLinkPins() {
	pls, err := loader.PinnedLinks(d.opts.PinDir)
	if err != nil {
		d.log.Warn("read link pins", "err", err)
		return
	}
	tc := map[string]bool{}
	for _, name := range d.syn.tcIfaces() {
		tc[name] = true
	}
	for _, pl := range pls {
		if (pl.Kind == "xdp" && d.atts[pl.Name] != nil) || (pl.Kind == "tcx" && tc[pl.Name]) {
			continue
		}
		switch {
		case !pl.Ours:
			d.log.Warn("a link pinned in the pin directory runs a program that is not Edgeguard's: left alone",
				"pin", pl.Path, "program", pl.Program, "ifindex", pl.Ifindex)
			continue
		case pl.Ifindex == 0:
			if err := pl.Remove(); err != nil {
				d.log.Error("remove a severed link's pin", "err", err)
				continue
			}
			d.log.Warn("removed the pin of a severed link: the interface it was attached to is gone",
				"kind", pl.Kind, "iface", pl.Name, "pin", pl.Path)
		default:
			if err := pl.Remove(); err != nil {
				d.log.Error("detach a link the policy does not name", "err", err)
				continue
			}
			d.log.Warn("detached a link an earlier run left: the policy does not name its interface",
				"kind", pl.Kind, "iface", pl.Iface, "pinned_as", pl.Name, "ifindex", pl.Ifindex)
		}
	}
}
