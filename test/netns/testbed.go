// Package netns builds private network-namespace topologies for tests, on
// top of internal/testbed: everything a Testbed creates is removed in
// t.Cleanup, also when the test fails, and any helper error fails the test.
//
// Namespaces are called eg-test-<pid>-<n>-<seq>-<role>. A test binary
// killed before its cleanups ran leaves them behind; the next New removes
// those whose pid is gone (testbed.RemoveStale).
package netns

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// Types shared with internal/testbed.
type (
	Namespace = testbed.Namespace
	Endpoint  = testbed.Endpoint
	Veth      = testbed.Veth
	VethSpec  = testbed.VethSpec
	Star      = testbed.Star
	Client    = testbed.Client
)

// MaxClients is how many clients a star holds.
const MaxClients = testbed.MaxClients

// namePrefix names a test process's namespaces; RemoveStale matches it.
const namePrefix = "eg-test"

// RequireRoot skips tb when not running as root, with the reason. In CI
// a skip would hide a regression, so it fails.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	testenv.RequireRoot(tb)
}

// testbedSeq keeps the namespace names of the tests of one process apart.
var testbedSeq atomic.Uint64

// Testbed owns the namespaces and links of one test.
type Testbed struct {
	tb testing.TB
	tp *testbed.Testbed
}

// New returns an empty testbed. It skips (or, in CI, fails) the test when
// not root.
func New(tb testing.TB) *Testbed {
	tb.Helper()
	RequireRoot(tb)
	if removed, err := testbed.RemoveStale(namePrefix); err != nil {
		tb.Logf("removing stale namespaces: %v", err)
	} else if len(removed) > 0 {
		tb.Logf("removed %d namespaces and pin directories left by killed test runs: %v", len(removed), removed)
	}
	tp := testbed.New(fmt.Sprintf("%s-%d-%d", namePrefix, os.Getpid(), testbedSeq.Add(1)))
	tb.Cleanup(func() {
		if err := tp.Close(); err != nil {
			tb.Errorf("tear down testbed: %v", err)
		}
	})
	return &Testbed{tb: tb, tp: tp}
}

// Lib is the underlying internal/testbed value.
func (t *Testbed) Lib() *testbed.Testbed { return t.tp }

// Namespace creates a namespace with its loopback up, removed when the test
// ends.
func (t *Testbed) Namespace(role string) *Namespace {
	t.tb.Helper()
	ns, err := t.tp.Namespace(role)
	if err != nil {
		t.tb.Fatal(err)
	}
	return ns
}

// Connect creates a veth pair from a to b (see testbed.Testbed.Connect).
func (t *Testbed) Connect(a, b *Namespace, spec VethSpec) *Veth {
	t.tb.Helper()
	v, err := t.tp.Connect(a, b, spec)
	if err != nil {
		t.tb.Fatal(err)
	}
	return v
}

// Star builds an edge namespace and n client namespaces (see
// testbed.Testbed.Star).
func (t *Testbed) Star(n int) *Star {
	t.tb.Helper()
	s, err := t.tp.Star(n)
	if err != nil {
		t.tb.Fatal(err)
	}
	return s
}
