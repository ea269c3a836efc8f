package fleet

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)

func TestEntryRoundTrip(t *testing.T) {
	for _, e := range []ListEntry{
		{Op: OpAdd, List: "deny", Prefix: netip.MustParsePrefix("198.18.4.0/24"), Expires: t0.Add(time.Hour), Origin: "cli", Host: "edge-a", Reason: "flood", At: t0},
		{Op: OpAdd, List: "allow", Prefix: netip.MustParsePrefix("fd00:1::/64"), Origin: "l7", Host: "b", At: t0},
		{Op: OpDel, List: "deny", Prefix: netip.MustParsePrefix("198.18.0.1/32"), Origin: "shield", Host: "c.x_1", At: t0},
	} {
		got, err := DecodeEntry(e.Encode(), t0)
		if err != nil {
			t.Fatalf("%+v: %v", e, err)
		}
		if got != e {
			t.Errorf("round trip: got %+v, want %+v", got, e)
		}
	}
}

// TestDecodeHostileEntries feeds entries another party could write into
// the fleet's Redis: every one must be refused as malformed, none may
// panic, and none may come out as a usable entry.
func TestDecodeHostileEntries(t *testing.T) {
	ok := `"v":1,"op":"add","list":"deny","origin":"cli","host":"a","at_ms":1764637200000`
	for name, raw := range map[string]string{
		"empty":             ``,
		"not json":          `deny 0.0.0.0/0`,
		"array":             `[1,2]`,
		"everything v4":     `{` + ok + `,"prefix":"0.0.0.0/0"}`,
		"everything v6":     `{` + ok + `,"prefix":"::/0"}`,
		"host bits":         `{` + ok + `,"prefix":"198.18.0.1/16"}`,
		"mapped":            `{` + ok + `,"prefix":"::ffff:198.18.0.0/112"}`,
		"zone":              `{` + ok + `,"prefix":"fe80::1%eth0"}`,
		"no prefix":         `{` + ok + `}`,
		"garbage prefix":    `{` + ok + `,"prefix":"198.18.0.0/33"}`,
		"version 2":         `{"v":2,"op":"add","list":"deny","origin":"cli","host":"a","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"no version":        `{"op":"add","list":"deny","origin":"cli","host":"a","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"unknown op":        `{"v":1,"op":"flush","list":"deny","origin":"cli","host":"a","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"unknown list":      `{"v":1,"op":"add","list":"protected","origin":"cli","host":"a","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"unknown origin":    `{"v":1,"op":"add","list":"deny","origin":"policy","host":"a","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"bad host":          `{"v":1,"op":"add","list":"deny","origin":"cli","host":"a b","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"empty host":        `{"v":1,"op":"add","list":"deny","origin":"cli","host":"","at_ms":1,"prefix":"198.18.0.0/24"}`,
		"no time":           `{"v":1,"op":"add","list":"deny","origin":"cli","host":"a","prefix":"198.18.0.0/24"}`,
		"negative expiry":   `{` + ok + `,"prefix":"198.18.0.0/24","expires_ms":-5}`,
		"expiry in 10y":     `{` + ok + `,"prefix":"198.18.0.0/24","expires_ms":2080000000000}`,
		"unknown field":     `{` + ok + `,"prefix":"198.18.0.0/24","force":true}`,
		"trailing":          `{` + ok + `,"prefix":"198.18.0.0/24"} {}`,
		"control in reason": `{` + ok + `,"prefix":"198.18.0.0/24","reason":"a\u001b[2Jb"}`,
		"newline reason":    `{` + ok + `,"prefix":"198.18.0.0/24","reason":"a\nb"}`,
		"long reason":       `{` + ok + `,"prefix":"198.18.0.0/24","reason":"` + strings.Repeat("x", 300) + `"}`,
		"huge":              `{` + ok + `,"prefix":"198.18.0.0/24","reason":"` + strings.Repeat("x", 5000) + `"}`,
		"number prefix":     `{` + ok + `,"prefix":42}`,
		"deep nesting":      strings.Repeat("[", 500),
	} {
		t.Run(name, func(t *testing.T) {
			e, err := DecodeEntry([]byte(raw), t0)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeEntry = %+v, %v; want ErrMalformed", e, err)
			}
		})
	}
}

// TestDecodeInvalidUTF8: JSON decoding replaces invalid UTF-8, so a
// reason that arrives broken is printable, never raw bytes.
func TestDecodeInvalidUTF8(t *testing.T) {
	raw := `{"v":1,"op":"add","list":"deny","origin":"cli","host":"a","at_ms":1764637200000,"prefix":"198.18.0.0/24","reason":"` + "\xff\xfe" + `"}`
	e, err := DecodeEntry([]byte(raw), t0)
	if err != nil || e.Reason != "\ufffd\ufffd" {
		t.Fatalf("DecodeEntry = %+v, %v", e, err)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	f.Add(ListEntry{Op: OpAdd, List: "deny", Prefix: netip.MustParsePrefix("198.18.4.0/24"), Origin: "cli", Host: "a", At: t0}.Encode())
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEntry(b, t0)
		if err != nil {
			return
		}
		if !e.Prefix.IsValid() || e.Prefix.Bits() == 0 || e.Prefix != e.Prefix.Masked() || len(e.Reason) > maxReasonBytes {
			t.Fatalf("accepted %q as %+v", b, e)
		}
	})
}

func TestCleanReason(t *testing.T) {
	for in, want := range map[string]string{
		"flood from AS64500":     "flood from AS64500",
		"a\nb\tc":                "a b c",
		"\xffx":                  "?x",
		strings.Repeat("é", 200): strings.Repeat("é", 128),
	} {
		got := CleanReason(in)
		if got != want {
			t.Errorf("CleanReason(%q) = %q, want %q", in, got, want)
		}
		e := ListEntry{Op: OpAdd, List: "deny", Prefix: netip.MustParsePrefix("198.18.4.0/24"), Origin: "cli", Host: "a", At: t0, Reason: got}
		if _, err := DecodeEntry(e.Encode(), t0); err != nil {
			t.Errorf("a cleaned reason is refused by the receiver: %v", err)
		}
	}
}
