package asn

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
)

// tsvBufferSize is the read buffer and therefore the longest accepted line.
const tsvBufferSize = 64 << 10

// ctxCheckLines is how often (in lines) a TSV read checks for cancellation.
const ctxCheckLines = 4096

func (b *builder) readTSVFile(ctx context.Context, file uint16, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	raw := bufio.NewReaderSize(&countingReader{r: f, p: &b.progress}, tsvBufferSize)
	src := raw
	if magic, _ := raw.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(raw)
		if err != nil {
			b.problem(file, 0, "gzip header is unreadable: %v", err)
			return nil
		}
		defer gz.Close()
		src = bufio.NewReaderSize(gz, tsvBufferSize)
	}
	return b.readTSV(ctx, file, src)
}

// isCorruptData reports whether a read error means the file content is bad
// (truncated or corrupt gzip) rather than the disk failing.
func isCorruptData(err error) bool {
	var corrupt flate.CorruptInputError
	return errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &corrupt)
}

func (b *builder) readTSV(ctx context.Context, file uint16, r *bufio.Reader) error {
	var line uint32
	for {
		raw, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line++
			b.stats.Lines++
			b.problem(file, line, "line is longer than %d bytes; expected range_start, range_end, AS_number, country_code, AS_description", tsvBufferSize)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
		} else if len(raw) > 0 {
			line++
			b.stats.Lines++
			b.parseTSVLine(file, line, raw)
		}
		if b.full() {
			b.more = true
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if isCorruptData(err) {
				b.problem(file, line+1, "compressed data is corrupt or truncated: %v", err)
				return nil
			}
			return fmt.Errorf("%s:%d: read: %w", b.paths[file], line+1, err)
		}
		if line%ctxCheckLines == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s:%d: %w", b.paths[file], line, err)
			}
		}
	}
}

// parseTSVLine parses "range_start\trange_end\tAS_number\tcountry_code\tAS_description".
// The description is optional and ignored. Blank lines and lines starting
// with '#' are skipped.
func (b *builder) parseTSVLine(file uint16, line uint32, raw []byte) {
	raw = bytes.TrimSuffix(raw, []byte{'\n'})
	raw = bytes.TrimSuffix(raw, []byte{'\r'})
	if len(raw) == 0 || raw[0] == '#' {
		return
	}
	var fields [5][]byte
	nf := 0
	for nf < 4 {
		i := bytes.IndexByte(raw, '\t')
		if i < 0 {
			break
		}
		fields[nf] = raw[:i]
		raw = raw[i+1:]
		nf++
	}
	fields[nf] = raw
	nf++
	if nf < 4 {
		b.problem(file, line, "expected 5 tab-separated fields (range_start, range_end, AS_number, country_code, AS_description), got %d", nf)
		return
	}
	start, ok := parseRangeAddr(fields[0])
	if !ok {
		b.problem(file, line, "range_start %q is not an IP address", fields[0])
		return
	}
	end, ok := parseRangeAddr(fields[1])
	if !ok {
		b.problem(file, line, "range_end %q is not an IP address", fields[1])
		return
	}
	if start.Is4In6() && end.Is4In6() {
		// Store IPv4-mapped ranges as IPv4, where Lookup looks for them.
		start, end = start.Unmap(), end.Unmap()
	}
	if start.Is4() != end.Is4() {
		b.problem(file, line, "range start %v and end %v are of different address families", start, end)
		return
	}
	if end.Less(start) {
		b.problem(file, line, "range end %v is before start %v", end, start)
		return
	}
	asn, ok := parseASN(fields[2])
	if !ok {
		b.problem(file, line, "AS_number %q is not a decimal number in 0..4294967295", fields[2])
		return
	}
	country, ok := parseCountry(fields[3])
	if !ok {
		b.problem(file, line, "country_code %q is not a two-letter ISO 3166 code, None or Unknown", fields[3])
		return
	}
	if asn == 0 {
		b.stats.NotRouted++
		return
	}
	b.stats.Ranges++
	b.spans = append(b.spans, span{
		start: u128From(start), end: u128From(end), asn: asn,
		line: line, file: file, country: country, is6: start.Is6(),
	})
}

// parseRangeAddr accepts what parseAddr accepts plus an IPv4 address written
// as a decimal integer, as in iptoasn's ip2asn-v4-u32 files.
func parseRangeAddr(s []byte) (netip.Addr, bool) {
	if v, ok := parseASN(s); ok { // same grammar: decimal in 0..2^32-1
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
	}
	return parseAddr(s)
}

// parseAddr parses an address without allocating; forms the fast parsers do
// not handle (IPv6 with an embedded IPv4 part, zones) go through netip.
// Zones are rejected. FuzzParseAddr checks it against netip.ParseAddr.
func parseAddr(s []byte) (netip.Addr, bool) {
	if bytes.IndexByte(s, ':') < 0 {
		return parseIPv4(s)
	}
	if bytes.IndexByte(s, '.') < 0 && bytes.IndexByte(s, '%') < 0 {
		return parseIPv6(s)
	}
	a, err := netip.ParseAddr(string(s))
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a, true
}

// parseIPv6 parses hex groups with at most one "::", the same grammar as
// netip.ParseAddr for IPv6 without an embedded IPv4 part or zone.
func parseIPv6(s []byte) (netip.Addr, bool) {
	var ip [16]byte
	ellipsis := -1 // byte index where "::" stands
	if len(s) >= 2 && s[0] == ':' && s[1] == ':' {
		ellipsis = 0
		s = s[2:]
		if len(s) == 0 {
			return netip.IPv6Unspecified(), true
		}
	}
	i := 0
	for i < 16 {
		acc, off := 0, 0
		for ; off < len(s); off++ {
			c := s[off]
			switch {
			case c >= '0' && c <= '9':
				acc = acc<<4 | int(c-'0')
			case c >= 'a' && c <= 'f':
				acc = acc<<4 | int(c-'a'+10)
			case c >= 'A' && c <= 'F':
				acc = acc<<4 | int(c-'A'+10)
			default:
				goto groupDone
			}
			if off >= 4 {
				return netip.Addr{}, false // more than 4 hex digits
			}
		}
	groupDone:
		if off == 0 {
			return netip.Addr{}, false
		}
		ip[i] = byte(acc >> 8)
		ip[i+1] = byte(acc)
		i += 2
		s = s[off:]
		if len(s) == 0 {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return netip.Addr{}, false
		}
		s = s[1:]
		if s[0] == ':' {
			if ellipsis >= 0 {
				return netip.Addr{}, false // second "::"
			}
			ellipsis = i
			s = s[1:]
			if len(s) == 0 {
				break
			}
		}
	}
	if len(s) != 0 {
		return netip.Addr{}, false
	}
	if i < 16 {
		if ellipsis < 0 {
			return netip.Addr{}, false // too few groups
		}
		n := 16 - i
		copy(ip[ellipsis+n:], ip[ellipsis:i])
		clear(ip[ellipsis : ellipsis+n])
	} else if ellipsis >= 0 {
		return netip.Addr{}, false // "::" must stand for at least one group
	}
	return netip.AddrFrom16(ip), true
}

// parseIPv4 accepts dotted decimal with exactly four octets and no leading
// zeros, like netip.ParseAddr.
func parseIPv4(s []byte) (netip.Addr, bool) {
	var out [4]byte
	octet := 0
	val := 0
	digits := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			if digits == 0 || octet > 3 {
				return netip.Addr{}, false
			}
			out[octet] = byte(val)
			octet++
			val, digits = 0, 0
			continue
		}
		c := s[i]
		if c < '0' || c > '9' {
			return netip.Addr{}, false
		}
		if digits > 0 && val == 0 {
			return netip.Addr{}, false // leading zero
		}
		val = val*10 + int(c-'0')
		digits++
		if val > 255 {
			return netip.Addr{}, false
		}
	}
	if octet != 4 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4(out), true
}

func parseASN(s []byte) (uint32, bool) {
	if len(s) == 0 || len(s) > 10 {
		return 0, false
	}
	var v uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > 1<<32-1 {
		return 0, false
	}
	return uint32(v), true
}

// parseCountry maps "None" and "Unknown" to zero and upper-cases two letters.
func parseCountry(s []byte) ([2]byte, bool) {
	if string(s) == "None" || string(s) == "Unknown" {
		return [2]byte{}, true
	}
	if len(s) != 2 {
		return [2]byte{}, false
	}
	var c [2]byte
	for i, ch := range s {
		switch {
		case ch >= 'A' && ch <= 'Z':
			c[i] = ch
		case ch >= 'a' && ch <= 'z':
			c[i] = ch - 'a' + 'A'
		default:
			return [2]byte{}, false
		}
	}
	return c, true
}
