package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestReadStampWins(t *testing.T) {
	i := Read(Stamp{Version: "v1.2.3", Commit: "0123456789abcdef0123", Date: "2026-12-01T00:00:00Z"})
	if i.Version != "v1.2.3" || i.Commit != "0123456789abcdef0123" || i.Source != "ldflags" {
		t.Fatalf("%+v", i)
	}
	if s := i.String(); !strings.Contains(s, "v1.2.3 (commit 0123456789ab, 2026-12-01T00:00:00Z, go") {
		t.Errorf("String() = %q", s)
	}
}

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "feedfacecafe0000"}, {Key: "vcs.time", Value: "2026-11-30T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	i := fromBuildInfo(bi, Info{Version: "unknown", Source: "none", GoVersion: "go1.x"})
	if i.Version != "devel" || i.Commit != "feedfacecafe0000" || !i.Modified || i.Source != "build info" {
		t.Fatalf("%+v", i)
	}
	if s := i.String(); !strings.Contains(s, "uncommitted changes") {
		t.Errorf("String() = %q", s)
	}
	// go run: no VCS settings, version (devel).
	i = fromBuildInfo(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Info{Version: "unknown", Source: "none", GoVersion: "go1.x"})
	if i.Version != "unknown" || i.Source != "none" || !strings.Contains(i.String(), "go run") {
		t.Errorf("go run build: %+v %q", i, i.String())
	}
	// go install module@v0.3.0 from the proxy.
	i = fromBuildInfo(&debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}}, Info{Version: "unknown", Source: "none"})
	if i.Version != "v0.3.0" || i.Source != "build info" {
		t.Errorf("module build: %+v", i)
	}
}
