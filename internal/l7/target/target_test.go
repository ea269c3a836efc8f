package target

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// The spellings of issue 29 and more: each with its normal form under the
// default rule and under strict ("400": refused). docs/l7-proxy.md holds
// the same table; keep them together.
var spellings = []struct {
	raw, normal, strict string
}{
	{"/limited/a", "/limited/a", "/limited/a"},
	{"", "/", "/"},
	{"/", "/", "/"},
	{"//limited/a", "/limited/a", "/limited/a"},
	{"/limited//a", "/limited/a", "/limited/a"},
	{"/./limited/a", "/limited/a", "/limited/a"},
	{"/x/../limited/a", "/limited/a", "/limited/a"},
	{"/%2e/limited/a", "/limited/a", "/limited/a"},
	{"/%2E%2E/limited/a", "/limited/a", "400"},
	{"/x/%2e%2e/limited/a", "/limited/a", "/limited/a"},
	{"/x/.%2e/limited/a", "/limited/a", "/limited/a"},
	{"/%09/../limited", "/limited", "400"},
	{"/%2flimited/a", "/limited/a", "400"},
	{"/limited%2Fa", "/limited/a", "400"},
	{"/\\limited/a", "/limited/a", "400"},
	{"/limited\\a", "/limited/a", "400"},
	{"/%5climited/a", "/limited/a", "400"},
	{"/LIMITED/a", "/LIMITED/a", "/LIMITED/a"},
	{"/%6C%69mited/a", "/limited/a", "/limited/a"},
	{"/limited/%7e%2D%5F", "/limited/~-_", "/limited/~-_"},
	{"/limited/a%3f", "/limited/a%3F", "/limited/a%3F"},
	{"/limited/a%25", "/limited/a%25", "400"},
	{"/limited/%252e%252e/x", "/limited/%252e%252e/x", "400"},
	{"/../limited/a", "/limited/a", "400"},
	{"/limited/a/..", "/limited/", "/limited/"},
	{"/limited/a/.", "/limited/a/", "/limited/a/"},
	{"/limited/a/", "/limited/a/", "/limited/a/"},
	{"/limited/.well-known", "/limited/.well-known", "/limited/.well-known"},
	{"/limited/..a", "/limited/..a", "/limited/..a"},
	{"/limited;x=1/a", "/limited;x=1/a", "400"},
	{"/limited%3Bx/a", "/limited%3Bx/a", "400"},
	{"/caf\xc3\xa9", "/caf%C3%A9", "/caf%C3%A9"},
	{"/a b", "/a%20b", "/a%20b"},
	{"/a%zz", "400", "400"},
	{"/a%4", "400", "400"},
	{"/a%00b", "400", "400"},
	{"/a%0d%0aX:y", "/a%0D%0AX:y", "400"},
	{"limited/a", "400", "400"},
	{"/a/b/c/../../../../x", "/x", "400"},
	{"/a/./b/./c", "/a/b/c", "/a/b/c"},
}

func outcome(s string, err error) string {
	if err != nil {
		if !errors.Is(err, ErrRefused) {
			return "wrong error " + err.Error()
		}
		return "400"
	}
	return s
}

func TestSpellings(t *testing.T) {
	for _, c := range spellings {
		if got := outcome(Normalize(c.raw, false)); got != c.normal {
			t.Errorf("Normalize(%q) = %q, want %q", c.raw, got, c.normal)
		}
		if got := outcome(Normalize(c.raw, true)); got != c.strict {
			t.Errorf("Normalize(%q, strict) = %q, want %q", c.raw, got, c.strict)
		}
		if got := outcome(reference(c.raw, false)); got != c.normal {
			t.Errorf("reference(%q) = %q, want %q (the reference disagrees with the table)", c.raw, got, c.normal)
		}
	}
}

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		in, path, query string
		hasQuery, ok    bool
	}{
		{"/a?b", "/a", "b", true, true},
		{"/a?", "/a", "", true, true},
		{"/a", "/a", "", false, true},
		{"http://a//limited/a", "//limited/a", "", false, true},
		{"http://a", "", "", false, true},
		{"http://a?x", "", "x", true, true},
		{"*", "", "", false, false},
		{"a:80", "", "", false, false},
	} {
		p, q, hq, ok := Split(c.in)
		if p != c.path || q != c.query || hq != c.hasQuery || ok != c.ok {
			t.Errorf("Split(%q) = %q %q %v %v, want %q %q %v %v", c.in, p, q, hq, ok, c.path, c.query, c.hasQuery, c.ok)
		}
	}
}

func TestDecode(t *testing.T) {
	for in, want := range map[string]string{"/a": "/a", "/a%3F": "/a?", "/caf%C3%A9": "/caf\u00e9", "/%25": "/%"} {
		if got := Decode(in); got != want {
			t.Errorf("Decode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNormalPathDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _, _ = Normalize("/limited/a/b.json", true) }); n != 0 {
		t.Errorf("Normalize of a normal path allocates %v times", n)
	}
}

// reference is a second, deliberately plain normaliser: string
// replacements, then RFC 3986 §5.2.4's remove_dot_segments as the RFC
// writes it (an input buffer and an output buffer). Only the default rule
// (strict false) is modelled beyond the refusals both share.
func reference(raw string, _ bool) (string, error) {
	if raw == "" {
		return "/", nil
	}
	if raw[0] != '/' {
		return "", refuse("relative")
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '%' {
			if i+2 >= len(raw) {
				return "", refuse("short")
			}
			n, err := strconv.ParseUint(raw[i+1:i+3], 16, 8)
			if err != nil {
				return "", refuse("hex")
			}
			v := byte(n)
			i += 2
			switch {
			case v == 0:
				return "", refuse("nul")
			case v == '/' || v == '\\':
				b.WriteByte('/')
			case strings.IndexByte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~", v) >= 0:
				b.WriteByte(v)
			default:
				fmt.Fprintf(&b, "%%%02X", v)
			}
			continue
		}
		switch {
		case c < 0x20 || c == 0x7f:
			return "", refuse("control")
		case c == '\\':
			b.WriteByte('/')
		case c == '/' || strings.IndexByte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@", c) >= 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	in := b.String()
	for strings.Contains(in, "//") {
		in = strings.ReplaceAll(in, "//", "/")
	}
	// remove_dot_segments, RFC 3986 §5.2.4.
	out := ""
	for in != "" {
		switch {
		case strings.HasPrefix(in, "../"):
			in = in[3:]
		case strings.HasPrefix(in, "./"):
			in = in[2:]
		case strings.HasPrefix(in, "/./"):
			in = in[2:]
		case in == "/.":
			in = "/"
		case strings.HasPrefix(in, "/../"):
			in = in[3:]
			if i := strings.LastIndexByte(out, '/'); i >= 0 {
				out = out[:i]
			} else {
				out = ""
			}
		case in == "/..":
			in = "/"
			if i := strings.LastIndexByte(out, '/'); i >= 0 {
				out = out[:i]
			} else {
				out = ""
			}
		case in == "." || in == "..":
			in = ""
		default:
			j := strings.IndexByte(in[1:], '/')
			if j < 0 {
				out += in
				in = ""
			} else {
				out += in[:j+1]
				in = in[j+1:]
			}
		}
	}
	if out == "" {
		out = "/"
	}
	return out, nil
}

// FuzzNormalize holds Normalize to the reference normaliser, and checks
// that a normal form is its own normal form (idempotence), that strict
// only ever refuses more (and otherwise agrees), and that the result holds
// only bytes that stand raw in a path.
func FuzzNormalize(f *testing.F) {
	for _, c := range spellings {
		f.Add(c.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := Normalize(raw, false)
		want, werr := reference(raw, false)
		if (err == nil) != (werr == nil) || got != want {
			t.Fatalf("Normalize(%q) = %q, %v; reference %q, %v", raw, got, err, want, werr)
		}
		if err != nil {
			return
		}
		if again, err := Normalize(got, false); err != nil || again != got {
			t.Fatalf("Normalize(%q) = %q, but Normalize(%q) = %q, %v", raw, got, got, again, err)
		}
		for i := 0; i < len(got); i++ {
			if c := got[i]; c != '/' && c != '%' && !pathByte(c) {
				t.Fatalf("Normalize(%q) = %q holds byte %q", raw, got, c)
			}
		}
		if s, err := Normalize(raw, true); err == nil && s != got {
			t.Fatalf("strict Normalize(%q) = %q, default %q", raw, s, got)
		}
	})
}
