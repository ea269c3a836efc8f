// Package version says which build of Edgeguard is running: the version,
// commit and date stamped by the Makefile (and the package build) with
// -ldflags, else what the Go toolchain recorded (runtime/debug build info:
// the module version and, for a build from a git checkout, vcs.revision,
// vcs.time and vcs.modified). 'go run' records no VCS information; Info
// then says so instead of guessing.
package version

import (
	"runtime"
	"runtime/debug"
)

// Info describes a build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Date      string `json:"date,omitempty"`
	Modified  bool   `json:"modified,omitempty"` // built from a checkout with uncommitted changes
	GoVersion string `json:"go_version"`
	// Source says where the fields came from: "ldflags", "build info"
	// (go build/go install in a git checkout or from the module proxy),
	// or "none" (go run, or a build without VCS information).
	Source string `json:"source"`
}

// Stamp holds the values the Makefile sets with
// -ldflags "-X main.version=... -X main.commit=... -X main.date=...".
type Stamp struct{ Version, Commit, Date string }

// Read combines the stamp with the toolchain's build information; stamped
// values win.
func Read(s Stamp) Info {
	info := Info{GoVersion: runtime.Version(), Source: "none", Version: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = fromBuildInfo(bi, info)
	}
	if s.Version != "" || s.Commit != "" {
		info.Source = "ldflags"
		if s.Version != "" {
			info.Version = s.Version
		}
		if s.Commit != "" {
			info.Commit = s.Commit
		}
		if s.Date != "" {
			info.Date = s.Date
		}
	}
	return info
}

func fromBuildInfo(bi *debug.BuildInfo, info Info) Info {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		info.Version, info.Source = v, "build info"
	}
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			info.Commit, info.Source = kv.Value, "build info"
		case "vcs.time":
			info.Date = kv.Value
		case "vcs.modified":
			info.Modified = kv.Value == "true"
		}
	}
	if info.Version == "unknown" && info.Commit != "" {
		info.Version = "devel"
	}
	return info
}

// String is one line for humans, e.g. "v0.3.0 (commit 1a2b3c4d5e6f, 2026-11-30T12:00:00Z, go1.25.1)".
func (i Info) String() string {
	s := i.Version + " ("
	switch {
	case i.Commit != "":
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		s += "commit " + c
		if i.Modified {
			s += " with uncommitted changes"
		}
		if i.Date != "" {
			s += ", " + i.Date
		}
	default:
		s += "no version or commit recorded: built with 'go run' or without VCS information; 'make build' stamps them"
	}
	return s + ", " + i.GoVersion + ")"
}
