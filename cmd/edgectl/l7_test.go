package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/control"
)

// TestStatusL7Section: `edgectl status` names the engine the L7 stage
// serves with, its address, upstream and routes; without an L7 stage it
// says off.
func TestStatusL7Section(t *testing.T) {
	st := statusFixture(control.IPv4Direct{})
	var without bytes.Buffer
	if err := writeStatus(&without, st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(without.String(), "l7 stage     off\n") {
		t.Fatalf("no 'l7 stage off' line without an L7 stage:\n%s", without.String())
	}
	st.L7 = &control.L7Status{Engine: "event-loop", Listen: "198.18.0.1:8080", Upstream: "http://127.0.0.1:9000",
		Routes: []string{"api", "login"}}
	var with bytes.Buffer
	if err := writeStatus(&with, st); err != nil {
		t.Fatal(err)
	}
	want := "l7 stage     event-loop engine on 198.18.0.1:8080, upstream http://127.0.0.1:9000, routes api, login\n"
	if !strings.Contains(with.String(), want) {
		t.Fatalf("status:\n%s\nwant the line %q", with.String(), want)
	}
	if !strings.Contains(with.String(), "l7 classes   off (l7.classes.enabled: false)\n") {
		t.Fatalf("status without a ranking:\n%s", with.String())
	}
	st.L7.Classes = []control.L7ClassStat{{Class: "established", Admitted: 99, Refused: 1}, {Class: "new", Admitted: 5, Refused: 95}}
	var ranked bytes.Buffer
	if err := writeStatus(&ranked, st); err != nil {
		t.Fatal(err)
	}
	if want := "l7 classes   admitted/requests: established 99/100, new 5/100\n"; !strings.Contains(ranked.String(), want) {
		t.Fatalf("status:\n%s\nwant the line %q", ranked.String(), want)
	}
}

// TestStatsL7Section: `edgectl stats` ends with the L7 stage's requests by
// route and decision; nothing without an L7 stage.
func TestStatsL7Section(t *testing.T) {
	var without bytes.Buffer
	if err := writeStats(&without, control.Stats{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(without.String(), "L7 ROUTE") {
		t.Fatalf("an l7 section without an L7 stage:\n%s", without.String())
	}
	var with bytes.Buffer
	st := control.Stats{L7: []control.L7RouteStat{{Route: "api", Allowed: 10, Limited: 3, Escalated: 1}, {Route: "(unmatched)", Allowed: 2}},
		L7Classes: []control.L7ClassStat{{Class: "established", Admitted: 12, Refused: 0}, {Class: "over_usual", Admitted: 1, Refused: 7}}}
	if err := writeStats(&with, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"   L7 ROUTE  ALLOWED  LIMITED  SHED  ESCALATED\n", "        api       10        3     0          1\n",
		"(unmatched)        2        0     0          0\n", "   L7 CLASS  ADMITTED  REFUSED\n", "  over_usual         1        7\n"} {
		if !strings.Contains(with.String(), want) {
			t.Fatalf("stats:\n%s\nwant %q", with.String(), want)
		}
	}
}

// TestExplainL7Line: `edgectl explain` says what class the address's next
// request would be charged as, and its budget.
func TestExplainL7Line(t *testing.T) {
	var b bytes.Buffer
	printExplainL7(&b, &control.ExplainL7{Next: "over_usual", Tracked: true, History: true, Learned: true,
		Usual: 20, Clump: 3, InWindow: 43, Budget: 43, Window: 10})
	want := "l7 class\tnext request: over_usual (L7 history; 43 requests in this 10s window, budget 43: headroom × usual 20 + clump 3)\n"
	if b.String() != want {
		t.Errorf("got %q\nwant %q", b.String(), want)
	}
	b.Reset()
	printExplainL7(&b, &control.ExplainL7{Next: "new"})
	if want := "l7 class\tnext request: new (not seen by the L7 stage)\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	printExplainL7(&b, nil)
	if b.Len() != 0 {
		t.Errorf("no ranking, yet %q", b.String())
	}
}
