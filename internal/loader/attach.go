package loader

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Mode is how the program attaches to an interface.
type Mode string

const (
	// ModeAuto tries native (driver) mode and falls back to generic.
	ModeAuto Mode = "auto"
	// ModeNative attaches in the driver's receive path, or fails.
	ModeNative Mode = "native"
	// ModeGeneric attaches after the skb is built; works everywhere, slower.
	ModeGeneric Mode = "generic"
)

// ParseMode parses "auto", "native" or "generic".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeNative, ModeGeneric:
		return m, nil
	case "":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("unknown xdp mode %q: use auto, native or generic", s)
}

// Attachment is the program attached to one interface through a BPF link.
type Attachment struct {
	Iface   string
	Ifindex int
	Mode    Mode   // the mode actually in use
	Slot    uint32 // counter slot (0: shared "other" slot)
	Link    link.Link
	// TookOver: the link is one an earlier run pinned (under this name,
	// or under the interface's old name before a rename); a failed start
	// releases it, it never detaches it.
	TookOver bool
}

// ErrOtherProgram means another XDP program is attached to the interface.
var ErrOtherProgram = errors.New("another xdp program is attached")

func (d *Datapath) linkPin(iface string) string {
	if d.pinDir == "" {
		return ""
	}
	return filepath.Join(d.pinDir, "links", iface)
}

// Attach attaches the program to iface. If a link pinned by an earlier run
// exists, its program is swapped for this one with an atomic link update, so
// there is no moment without enforcement. Attach never replaces a program
// that is not ours.
func (d *Datapath) Attach(iface string, mode Mode) (*Attachment, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", iface, err)
	}
	slot, err := d.assignSlot(ifc.Index)
	if err != nil {
		return nil, err
	}
	if pin := d.linkPin(iface); pin != "" {
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			err := l.Update(d.Entry())
			switch {
			case err == nil:
				d.log.Info("took over pinned xdp link", "iface", iface)
				return &Attachment{Iface: iface, Ifindex: ifc.Index, Mode: pinnedMode(ifc.Index), Slot: slot, Link: l, TookOver: true}, nil
			case errors.Is(err, unix.ENOLINK):
				// The interface was deleted (and maybe re-created under
				// the same name) while no daemon ran: the link is severed
				// and protects nothing. Drop its pin and attach afresh;
				// the maps, and all state, are kept.
				d.log.Warn("pinned xdp link was severed (interface re-created); attaching afresh", "iface", iface)
				if uerr := l.Unpin(); uerr != nil {
					l.Close()
					return nil, fmt.Errorf("remove severed xdp link pin on %s: %w", iface, uerr)
				}
				l.Close()
			default:
				l.Close()
				return nil, fmt.Errorf("update pinned xdp link on %s: %w", iface, err)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open pinned xdp link %s: %w", pin, err)
		}
		// No pin under this name: one under the interface's old name?
		l, err := adoptRenamed(d.log, d.pinDir, "xdp", ifc.Index, iface, d.Entry(), pin)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return &Attachment{Iface: iface, Ifindex: ifc.Index, Mode: pinnedMode(ifc.Index), Slot: slot, Link: l, TookOver: true}, nil
		}
	}
	if err := checkNoOtherXDP(ifc); err != nil {
		return nil, err
	}

	try := []Mode{mode}
	if mode == ModeAuto {
		try = []Mode{ModeNative, ModeGeneric}
	}
	var l link.Link
	var used Mode
	for _, m := range try {
		flags := link.XDPDriverMode
		if m == ModeGeneric {
			flags = link.XDPGenericMode
		}
		l, err = link.AttachXDP(link.XDPOptions{Program: d.Entry(), Interface: ifc.Index, Flags: flags})
		if err == nil {
			used = m
			break
		}
		d.log.Debug("xdp attach failed", "iface", iface, "mode", m, "err", err)
	}
	if err != nil {
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("attach to %s: %w", iface, checkNoOtherXDP(ifc))
		}
		return nil, fmt.Errorf("attach xdp to %s in %s mode: %w", iface, mode, err)
	}
	if pin := d.linkPin(iface); pin != "" {
		if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
			l.Close()
			return nil, fmt.Errorf("create link pin dir: %w", err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return nil, fmt.Errorf("pin xdp link on %s: %w", iface, err)
		}
	}
	return &Attachment{Iface: iface, Ifindex: ifc.Index, Mode: used, Slot: slot, Link: l}, nil
}

// checkNoOtherXDP returns ErrOtherProgram, with what is there and how to
// proceed, if some XDP program is attached to the interface.
func checkNoOtherXDP(ifc *net.Interface) error {
	nl, err := netlink.LinkByIndex(ifc.Index)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", ifc.Name, err)
	}
	x := nl.Attrs().Xdp
	if x == nil || !x.Attached || x.ProgId == 0 {
		return nil
	}
	name := "?"
	if p, err := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId)); err == nil {
		if info, err := p.Info(); err == nil {
			name = info.Name
		}
		p.Close()
	}
	return fmt.Errorf("%w on %s: program id %d (%s), attach mode %d; "+
		"Edgeguard never replaces it: detach it first (ip link set dev %s xdp off, or its owner's tool), "+
		"or chain both with a dispatcher such as libxdp", ErrOtherProgram, ifc.Name, x.ProgId, name, x.AttachMode, ifc.Name)
}

func pinnedMode(ifindex int) Mode {
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil || nl.Attrs().Xdp == nil {
		return ModeAuto
	}
	switch nl.Attrs().Xdp.AttachMode {
	case 1: // XDP_ATTACHED_DRV
		return ModeNative
	case 2: // XDP_ATTACHED_SKB
		return ModeGeneric
	}
	return ModeAuto
}

// Detach removes the link's pin and closes it: the program leaves the
// interface.
func (a *Attachment) Detach() error {
	if err := a.Link.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin xdp link on %s: %w", a.Iface, err)
	}
	if err := a.Link.Close(); err != nil {
		return fmt.Errorf("close xdp link on %s: %w", a.Iface, err)
	}
	return nil
}

// Release closes the link's file descriptor; a pinned link keeps enforcing.
func (a *Attachment) Release() error {
	return a.Link.Close()
}

// assignSlot gives the interface a counter slot of its own (1..15), keeping
// the one it already has (after a restart, from the pinned map). When all
// slots are taken the interface counts under slot 0 with the others.
func (d *Datapath) assignSlot(ifindex int) (uint32, error) {
	if ifindex <= 0 || ifindex >= int(LimiterEgSizesEG_IFINDEX_MAX) {
		return 0, nil
	}
	var slot uint32
	if err := d.Objects.IfaceSlots.Lookup(uint32(ifindex), &slot); err != nil {
		return 0, fmt.Errorf("read interface slot: %w", err)
	}
	if slot != 0 {
		return slot, nil
	}
	used := map[uint32]bool{}
	var k, v uint32
	it := d.Objects.IfaceSlots.Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			used[v] = true
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read interface slots: %w", err)
	}
	for s := uint32(1); s < uint32(LimiterEgSizesEG_IFACE_SLOTS); s++ {
		if !used[s] {
			if err := d.Objects.IfaceSlots.Put(uint32(ifindex), s); err != nil {
				return 0, fmt.Errorf("assign interface slot: %w", err)
			}
			return s, nil
		}
	}
	d.log.Warn("all interface counter slots taken; counting under 'other'", "ifindex", ifindex)
	return 0, nil
}

// Slots maps counter slots to interface indexes, as assigned by Attach.
func (d *Datapath) Slots() (map[uint32]int, error) {
	out := map[uint32]int{}
	var k, v uint32
	it := d.Objects.IfaceSlots.Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			out[v] = int(k)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read interface slots: %w", err)
	}
	return out, nil
}
