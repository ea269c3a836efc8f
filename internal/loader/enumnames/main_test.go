package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

func TestEnumNames(t *testing.T) {
	e := &btf.Enum{Name: "eg_x", Values: []btf.EnumValue{
		{Name: "EG_X_SOURCE_LIMIT", Value: 1}, {Name: "EG_X_OK", Value: 0}, {Name: "EG_X_MAX", Value: 2},
	}}
	got, err := enumNames(e, "EG_X_")
	if err != nil || strings.Join(got, ",") != "ok,source_limit" {
		t.Fatalf("enumNames = %q, %v; want [ok source_limit]", got, err)
	}
	for name, vals := range map[string][]btf.EnumValue{
		"gap":          {{Name: "EG_X_A", Value: 0}, {Name: "EG_X_B", Value: 2}},
		"duplicate":    {{Name: "EG_X_A", Value: 0}, {Name: "EG_X_B", Value: 0}},
		"other prefix": {{Name: "EG_X_A", Value: 0}, {Name: "EG_Y_B", Value: 1}},
	} {
		if got, err := enumNames(&btf.Enum{Name: "eg_x", Values: vals}, "EG_X_"); err == nil {
			t.Errorf("%s: enumNames = %q, want an error", name, got)
		}
	}
}

// The committed table is what the committed object says (CI's make
// generate checks the same from the C source).
func TestCommittedNames(t *testing.T) {
	out := filepath.Join(t.TempDir(), "names.go")
	if err := run([]string{"-o", out, "-go-package", "loader", "-ident-prefix", "Limiter", "../limiter_bpfel.o",
		"eg_reason=EG_R_"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{`"source_limit"`, `"allow_list"`, `"icmp_wrong_family"`} {
		if !strings.Contains(string(b), label) {
			t.Errorf("generated reason names lack %s:\n%s", label, b)
		}
	}
}
