package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// ListEntry is one shared deny/allow list change as hosts publish it to
// the fleet's stream and snapshot: an addition (or refresh) or a removal.
type ListEntry struct {
	Op     Op
	List   string // "deny" or "allow"
	Prefix netip.Prefix
	// Expires is when the entry stops applying (wall clock, UTC); zero:
	// until removed.
	Expires time.Time
	// Origin is who added it on its host: cli, l7 or shield.
	Origin string
	// Host is the host that published it.
	Host   string
	Reason string
	// At is when it was published.
	At time.Time
}

// Op is a list change's kind.
type Op string

// List change kinds.
const (
	OpAdd Op = "add"
	OpDel Op = "del"
)

// Bounds of a list entry read from Redis: anything larger is malformed.
const (
	maxEntryBytes  = 1024
	maxReasonBytes = 256
	// maxEntryTTL bounds how far in the future an entry from Redis may
	// expire: a year (the CLI's entries without a TTL are published with
	// none, which is allowed).
	maxEntryTTL = 366 * 24 * time.Hour
)

// wireEntry is the JSON form, version 1.
type wireEntry struct {
	V       int    `json:"v"`
	Op      Op     `json:"op"`
	List    string `json:"list"`
	Prefix  string `json:"prefix"`
	Expires int64  `json:"expires_ms,omitempty"` // unix ms; 0: never
	Origin  string `json:"origin"`
	Host    string `json:"host"`
	Reason  string `json:"reason,omitempty"`
	At      int64  `json:"at_ms"`
}

// Encode is the entry's wire form.
func (e ListEntry) Encode() []byte {
	w := wireEntry{V: 1, Op: e.Op, List: e.List, Prefix: e.Prefix.String(), Origin: e.Origin, Host: e.Host,
		Reason: e.Reason, At: e.At.UnixMilli()}
	if !e.Expires.IsZero() {
		w.Expires = e.Expires.UnixMilli()
	}
	b, _ := json.Marshal(w)
	return b
}

// field is the entry's snapshot field: one per list and prefix, so the
// last change of a prefix wins.
func (e ListEntry) field() string { return e.List + "|" + e.Prefix.String() }

// ErrMalformed marks an entry read from Redis that is not a list entry
// this version writes.
var ErrMalformed = errors.New("malformed fleet list entry")

// DecodeEntry parses and checks an entry read from Redis. Redis is shared
// and its content is input like any other: every field is bounded and
// checked as the CLI checks its own (a real prefix, masked, not IPv4-mapped,
// not /0, a known list, origin and op, a host id, a bounded reason without
// control characters, an expiry within a year). The receiving daemon then
// applies its own width and lists.protected checks on top.
func DecodeEntry(b []byte, now time.Time) (ListEntry, error) {
	if len(b) > maxEntryBytes {
		return ListEntry{}, fmt.Errorf("%w: %d bytes, at most %d", ErrMalformed, len(b), maxEntryBytes)
	}
	var w wireEntry
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return ListEntry{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if dec.More() {
		return ListEntry{}, fmt.Errorf("%w: trailing data", ErrMalformed)
	}
	if w.V != 1 {
		return ListEntry{}, fmt.Errorf("%w: version %d, this host reads 1", ErrMalformed, w.V)
	}
	e := ListEntry{Op: w.Op, List: w.List, Origin: w.Origin, Host: w.Host, Reason: w.Reason}
	if e.Op != OpAdd && e.Op != OpDel {
		return ListEntry{}, fmt.Errorf("%w: op %q", ErrMalformed, w.Op)
	}
	if e.List != "deny" && e.List != "allow" {
		return ListEntry{}, fmt.Errorf("%w: list %q", ErrMalformed, w.List)
	}
	p, err := policy.ParsePrefix(w.Prefix)
	if err != nil {
		return ListEntry{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if p.Bits() == 0 {
		return ListEntry{}, fmt.Errorf("%w: %s covers every address", ErrMalformed, p)
	}
	e.Prefix = p
	switch e.Origin {
	case "cli", "l7", "shield":
	default:
		return ListEntry{}, fmt.Errorf("%w: origin %q", ErrMalformed, w.Origin)
	}
	if !policy.ValidHostID(e.Host) {
		return ListEntry{}, fmt.Errorf("%w: host %q", ErrMalformed, w.Host)
	}
	if len(e.Reason) > maxReasonBytes || !utf8.ValidString(e.Reason) {
		return ListEntry{}, fmt.Errorf("%w: reason longer than %d bytes or not UTF-8", ErrMalformed, maxReasonBytes)
	}
	for _, r := range e.Reason {
		if unicode.IsControl(r) {
			return ListEntry{}, fmt.Errorf("%w: control character in reason", ErrMalformed)
		}
	}
	if w.At <= 0 {
		return ListEntry{}, fmt.Errorf("%w: no publication time", ErrMalformed)
	}
	e.At = time.UnixMilli(w.At).UTC()
	switch {
	case w.Expires < 0:
		return ListEntry{}, fmt.Errorf("%w: negative expiry", ErrMalformed)
	case w.Expires > 0:
		e.Expires = time.UnixMilli(w.Expires).UTC()
		if e.Expires.After(now.Add(maxEntryTTL)) {
			return ListEntry{}, fmt.Errorf("%w: expires %s, more than %s ahead", ErrMalformed, e.Expires.Format(time.RFC3339), maxEntryTTL)
		}
	}
	return e, nil
}

// Expired reports whether an addition no longer applies at now.
func (e ListEntry) Expired(now time.Time) bool { return !e.Expires.IsZero() && !e.Expires.After(now) }

// CleanReason makes a local reason publishable: control characters become
// spaces and it is cut to maxReasonBytes on a rune boundary, so every host
// accepts what this one publishes.
func CleanReason(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	for len(s) > maxReasonBytes {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
