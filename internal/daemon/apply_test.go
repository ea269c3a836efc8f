package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
)

// TestStatusAnswersWhileApplyStages: the new generation is written with
// the daemon's state lock free, so status answers (with the running
// generation) while an apply is between writing the tables and committing;
// the commit then makes the new one live. Interfaces stay as they are (a
// placeholder attachment), so nothing is attached.
func TestStatusAnswersWhileApplyStages(t *testing.T) {
	d := loadedDaemon(t, Options{Ifaces: []string{"egkg-none0"}}, v4Policy(64, "198.18.1.0/24"))
	d.mu.Lock()
	d.atts["egkg-none0"] = &loader.Attachment{Iface: "egkg-none0"}
	gen0 := d.generation
	d.mu.Unlock()
	dataGen0, err := d.m.Generations.Active()
	if err != nil {
		t.Fatal(err)
	}
	next, err := d.prepare(context.Background(), []byte(v4Policy(64, "198.18.2.0/24", "198.18.3.0/24")), "q.yaml")
	if err != nil {
		t.Fatal(err)
	}
	staged, release := make(chan struct{}), make(chan struct{})
	d.staged = func() {
		close(staged)
		<-release
	}
	applied := make(chan error, 1)
	go func() {
		d.changeMu.Lock()
		defer d.changeMu.Unlock()
		applied <- d.apply(context.Background(), next, "test")
	}()
	// Deadlock detectors, not speed bounds: generous for a loaded machine.
	select {
	case <-staged:
	case err := <-applied:
		t.Fatalf("apply returned before committing: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("apply did not reach its commit")
	}
	status := make(chan control.Status, 1)
	go func() { status <- d.Status() }()
	select {
	case st := <-status:
		if st.Generation != gen0 || st.DataGen != dataGen0 {
			t.Errorf("status while staging: generation %d, data plane %d; want the running %d, %d",
				st.Generation, st.DataGen, gen0, dataGen0)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("status blocked while apply was writing the new generation")
	}
	close(release)
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	st := d.Status()
	if st.Generation != gen0+1 || st.DataGen != dataGen0^1 {
		t.Errorf("after the commit: generation %d, data plane %d; want %d, %d", st.Generation, st.DataGen, gen0+1, dataGen0^1)
	}
}
