package daemon

import (
	"context"
	"time"

	"github.com/vishvananda/netlink"
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
