// Package target normalises the path of an HTTP request target, so that a
// limit on a path holds for every spelling of it. Both L7 engines
// (internal/l7/proxy and internal/l7/eventloop) route by, and by default
// forward, the path Normalize returns; any other caller that decides by a
// path (an Envoy RLS or nginx subrequest service) should use the same
// function so that every way in agrees. The rule and a table of spellings
// and outcomes are in docs/l7-proxy.md ("Request targets").
//
// Normalize applies, in this order (RFC 3986 §6.2.2):
//
//  1. percent-decoding of unreserved characters (ALPHA DIGIT - . _ ~), and
//     upper-case hex digits in every percent-encoding left;
//  2. an encoded slash (%2F) and a backslash (raw or %5C) become a slash,
//     as nginx, IIS and browsers read them (Strict: refused);
//  3. duplicate slashes merged (nginx's merge_slashes);
//  4. dot segments removed (RFC 3986 §5.2.4), "." and ".." included when
//     they were spelled %2e; a ".." above the root stays at the root
//     (Strict: refused);
//  5. every byte that may not stand raw in a path (non-ASCII, controls,
//     space, "<>\"{}|^`") percent-encoded.
//
// It refuses, in either mode, an invalid percent-encoding ("%zz", "%4"),
// an encoded NUL and a raw control character (the engines' parsers refuse
// those on the wire already). Strict also refuses what some upstream could read
// differently from the normalised path: the rewrites of steps 2 and 4
// above, an encoded control character, an encoded "%" (a second decoding
// would change the path) and ";" (Tomcat and Spring strip ";params" from a
// segment).
//
// Case is left alone: a route that wants case-insensitive matching
// compares case-insensitively with the normalised path.
package target

import (
	"errors"
	"strings"
)

// ErrRefused is wrapped by every error Normalize returns: the target
// cannot be normalised safely, and the request is answered 400.
var ErrRefused = errors.New("request target refused")

// Error is a refused target, with the reason.
type Error struct{ Reason string }

func (e *Error) Error() string { return "request target refused: " + e.Reason }

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (e *Error) Unwrap() error { return ErrRefused }

func refuse(reason string) error { return &Error{Reason: reason} }

// Normalize returns the normalised form of raw, the path of a request
// target as sent (percent-encoded, without the query), in its encoded
// form: a path to forward, and, decoded with Decode, to match routes by.
// An empty raw path is "/". When raw is already normal it is returned
// as is, without allocating.
func Normalize(raw string, strict bool) (string, error) {
	if raw == "" {
		return "/", nil
	}
	if raw[0] != '/' {
		return "", refuse("path does not start with /")
	}
	if isNormal(raw, strict) {
		return raw, nil
	}
	return normalize(raw, strict)
}

// isNormal reports whether raw is already its own normal form: only
// bytes that stand raw in a path, no percent sign, no empty, "." or ".."
// segment.
func isNormal(raw string, strict bool) bool {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '/':
			if i+1 < len(raw) && raw[i+1] == '/' {
				return false
			}
			if i+1 < len(raw) && raw[i+1] == '.' {
				// "/." or "/..", ending the path or a segment.
				j := i + 2
				if j < len(raw) && raw[j] == '.' {
					j++
				}
				if j == len(raw) || raw[j] == '/' {
					return false
				}
			}
		case c == ';':
			if strict {
				return false
			}
		case !pathByte(c):
			return false
		}
	}
	return true
}

// normalize is Normalize's slow path.
func normalize(raw string, strict bool) (string, error) {
	// Steps 1, 2 and 5 into dec, where '/' is a separator and only a
	// separator: every other byte is a segment's byte in its output
	// spelling.
	dec := make([]byte, 0, len(raw)+8)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				return "", refuse("invalid percent-encoding")
			}
			v := unhex(raw[i+1])<<4 | unhex(raw[i+2])
			i += 2
			switch {
			case v == 0:
				return "", refuse("encoded NUL")
			case unreserved(v):
				dec = append(dec, v)
			case v == '/':
				if strict {
					return "", refuse("encoded slash (%2F)")
				}
				dec = append(dec, '/')
			case v == '\\':
				if strict {
					return "", refuse("encoded backslash (%5C)")
				}
				dec = append(dec, '/')
			case strict && (v < 0x20 || v == 0x7f):
				return "", refuse("encoded control character")
			case strict && v == '%':
				return "", refuse("encoded percent sign (double encoding)")
			case strict && v == ';':
				return "", refuse("encoded semicolon")
			default:
				dec = appendEscaped(dec, v)
			}
		case c < 0x20 || c == 0x7f:
			return "", refuse("control character")
		case c == '\\':
			if strict {
				return "", refuse("backslash")
			}
			dec = append(dec, '/')
		case c == ';' && strict:
			return "", refuse("semicolon (path parameter)")
		case c == '/' || pathByte(c):
			dec = append(dec, c)
		default:
			dec = appendEscaped(dec, c)
		}
	}
	// Steps 3 and 4 over the segments of dec.
	out := make([]byte, 0, len(dec)+1)
	trailing := false
	for len(dec) > 0 {
		var seg []byte
		if j := indexSlash(dec); j >= 0 {
			seg, dec = dec[:j], dec[j+1:]
			trailing = true
		} else {
			seg, dec = dec, nil
			trailing = false
		}
		switch string(seg) {
		case "":
			// Empty: a leading or doubled slash.
		case ".":
			trailing = true
		case "..":
			trailing = true
			if len(out) == 0 {
				if strict {
					return "", refuse("dot segment above the root")
				}
				continue
			}
			out = out[:lastSlash(out)]
		default:
			out = append(out, '/')
			out = append(out, seg...)
		}
	}
	if len(out) == 0 || trailing {
		out = append(out, '/')
	}
	return string(out), nil
}

// Decode is the decoded form of a normalised path (the path routes match):
// every percent-encoding left in it decoded. A normalised path holds only
// valid encodings, so Decode cannot fail; it does not allocate when there
// is nothing to decode.
func Decode(normal string) string {
	if strings.IndexByte(normal, '%') < 0 {
		return normal
	}
	b := make([]byte, 0, len(normal))
	for i := 0; i < len(normal); i++ {
		if c := normal[i]; c == '%' && i+2 < len(normal) && isHex(normal[i+1]) && isHex(normal[i+2]) {
			b = append(b, unhex(normal[i+1])<<4|unhex(normal[i+2]))
			i += 2
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

// Split takes a request target as sent (origin or absolute form) apart
// into its path (as sent, "" for an absolute form without one) and its
// query (without "?"; hasQuery tells "?" alone from none). An asterisk
// form or an authority form is not a path: ok is false.
func Split(requestTarget string) (path, query string, hasQuery, ok bool) {
	t := requestTarget
	if t == "" || t == "*" {
		return "", "", false, false
	}
	if t[0] != '/' {
		// Absolute form: scheme "://" authority path.
		i := strings.Index(t, "://")
		if i <= 0 {
			return "", "", false, false
		}
		t = t[i+3:]
		j := strings.IndexAny(t, "/?")
		if j < 0 {
			return "", "", false, true
		}
		t = t[j:]
	}
	path, query, hasQuery = strings.Cut(t, "?")
	return path, query, hasQuery, true
}

func indexSlash(b []byte) int {
	for i, c := range b {
		if c == '/' {
			return i
		}
	}
	return -1
}

func lastSlash(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '/' {
			return i
		}
	}
	return 0
}

// unreserved is RFC 3986 §2.3.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// pathByte reports whether c stands raw in a path segment (RFC 3986
// pchar without pct-encoded: unreserved, sub-delims, ":" and "@").
func pathByte(c byte) bool {
	return unreserved(c) || strings.IndexByte("!$&'()*+,;=:@", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func appendEscaped(b []byte, c byte) []byte {
	const hex = "0123456789ABCDEF"
	return append(b, '%', hex[c>>4], hex[c&15])
}
