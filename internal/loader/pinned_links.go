package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Link pins and renamed interfaces (docs/operations.md, "Pins"). A link is
// pinned under the name of the interface it was attached to; the kernel
// attaches it to the interface's index, which a rename keeps. So after a
// rename the pin's name is stale while the link still enforces: Attach and
// AttachTC adopt it under the new name, and PinnedLinks says where every
// pinned link is now, for the daemon to report or remove the ones no
// policy names.

// PinnedLink is a link an earlier run pinned in the pin directory.
type PinnedLink struct {
	// Kind is "xdp" (PIN_DIR/links/NAME) or "tcx" (the SYN path's
	// PIN_DIR/syn/links/tcx-NAME).
	Kind string
	Path string
	// Name is the interface's name when the link was attached.
	Name string
	// Ifindex is the interface the link is on now; 0 when the link is
	// severed (its interface was deleted).
	Ifindex int
	// Iface is that interface's name now ("" when severed); it differs
	// from Name when the interface was renamed.
	Iface string
	// Program is the name of the program the link runs; Ours is whether
	// it is one of Edgeguard's.
	Program string
	Ours    bool
}

// ourPrograms are the programs Edgeguard's links run (the kernel keeps
// the first 15 bytes of a name).
var ourPrograms = map[string]bool{"xdp_limiter": true, "eg_syn_xdp": true, "eg_syn_tc": true}

// PinnedLinks lists the XDP and tcx links pinned in pinDir, and where each
// one is now.
func PinnedLinks(pinDir string) ([]PinnedLink, error) {
	if pinDir == "" {
		return nil, nil
	}
	xdp, err := pinnedLinks(filepath.Join(pinDir, "links"), "xdp", "")
	if err != nil {
		return nil, err
	}
	tcx, err := pinnedLinks(filepath.Join(pinDir, "syn", "links"), "tcx", "tcx-")
	if err != nil {
		return nil, err
	}
	return append(xdp, tcx...), nil
}

func pinnedLinks(dir, kind, prefix string) ([]PinnedLink, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read link pins in %s: %w", dir, err)
	}
	var out []PinnedLink
	for _, e := range ents {
		if e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		pl, err := inspectPin(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		pl.Kind, pl.Name = kind, strings.TrimPrefix(e.Name(), prefix)
		out = append(out, pl)
	}
	return out, nil
}

func inspectPin(path string) (PinnedLink, error) {
	pl := PinnedLink{Path: path}
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return pl, fmt.Errorf("open link pin %s: %w", path, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return pl, fmt.Errorf("link pin %s: %w", path, err)
	}
	if x := info.XDP(); x != nil {
		pl.Ifindex = int(x.Ifindex)
	} else if t := info.TCX(); t != nil {
		pl.Ifindex = int(t.Ifindex)
	}
	if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
		if pi, err := p.Info(); err == nil {
			pl.Program = pi.Name
		}
		p.Close()
	}
	pl.Ours = ourPrograms[pl.Program]
	if pl.Ifindex != 0 {
		if nl, err := netlink.LinkByIndex(pl.Ifindex); err == nil {
			pl.Iface = nl.Attrs().Name
		} else {
			pl.Ifindex = 0 // deleted between the two reads
		}
	}
	return pl, nil
}

// Remove deletes the pin: the link, and the program's attachment with
// it, goes unless a running process holds it.
func (pl PinnedLink) Remove() error {
	if err := os.Remove(pl.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove link pin %s: %w", pl.Path, err)
	}
	return nil
}

// adoptRenamed takes over a link of ours of the given kind pinned under
// another interface name but attached to ifindex (the interface was
// renamed since): the program is swapped for prog and the pin moves to
// pin. Nil when there is none.
func adoptRenamed(log *slog.Logger, pinDir, kind string, ifindex int, iface string, prog *ebpf.Program, pin string) (link.Link, error) {
	pls, err := PinnedLinks(pinDir)
	if err != nil {
		return nil, err
	}
	for _, pl := range pls {
		if pl.Kind != kind || pl.Ifindex != ifindex || pl.Name == iface || !pl.Ours {
			continue
		}
		l, err := link.LoadPinnedLink(pl.Path, nil)
		if err != nil {
			return nil, fmt.Errorf("open %s link pin %s: %w", kind, pl.Path, err)
		}
		if err := l.Update(prog); err != nil {
			l.Close()
			return nil, fmt.Errorf("update %s link pinned for %s (now %s): %w", kind, pl.Name, iface, err)
		}
		if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
			l.Close()
			return nil, fmt.Errorf("create link pin dir: %w", err)
		}
		// Pinning a pinned link renames its pin.
		if err := l.Pin(pin); err != nil {
			l.Close()
			return nil, fmt.Errorf("move %s link pin %s to %s: %w", kind, pl.Path, pin, err)
		}
		log.Warn("interface renamed: took over the link pinned under its old name", "kind", kind,
			"iface", iface, "was", pl.Name, "ifindex", ifindex, "pin", pin)
		return l, nil
	}
	return nil, nil
}
