package asn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// DefaultMaxProblems is the number of problems collected before a load stops
// reading when Options.MaxProblems is zero.
const DefaultMaxProblems = 20

// Options controls a load. The zero value is ready to use.
type Options struct {
	// Progress, if set, is called from the loading goroutine with the bytes
	// read so far and the total size of all input files: about every 1 MiB,
	// and once with done == total at the end of a successful load. For a
	// MaxMind DB "bytes read" is the fraction of the address space walked,
	// scaled to the file size.
	Progress func(done, total int64)
	// MaxProblems bounds how many problems are collected before reading stops;
	// 0 means DefaultMaxProblems.
	MaxProblems int
}

// Format is the detected format of an input file.
type Format int

const (
	FormatTSV     Format = iota // iptoasn TSV, plain
	FormatTSVGzip               // iptoasn TSV, gzip-compressed
	FormatMMDB                  // MaxMind DB
)

func (f Format) String() string {
	switch f {
	case FormatTSV:
		return "tsv"
	case FormatTSVGzip:
		return "tsv.gz"
	case FormatMMDB:
		return "mmdb"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// mmdbMarker starts the metadata section at the end of every MaxMind DB.
var mmdbMarker = []byte("\xab\xcd\xefMaxMind.com")

// mmdbMetadataMaxSize is how far from the end the spec allows the marker to be.
const mmdbMetadataMaxSize = 128 << 10

// DetectFormat reports the format of the file at path by content: gzip magic
// bytes 1f 8b, then the MaxMind DB metadata marker in the last 128 KiB,
// otherwise TSV. The name does not matter.
func DetectFormat(path string) (Format, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("detect format: %w", err)
	}
	defer f.Close()
	var magic [2]byte
	n, err := io.ReadFull(f, magic[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("detect format of %s: %w", path, err)
	}
	if n == 2 && magic == [2]byte{0x1f, 0x8b} {
		return FormatTSVGzip, nil
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("detect format of %s: %w", path, err)
	}
	off := max(fi.Size()-mmdbMetadataMaxSize, 0)
	tail := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(tail, off); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("detect format of %s: %w", path, err)
	}
	if bytes.Contains(tail, mmdbMarker) {
		return FormatMMDB, nil
	}
	return FormatTSV, nil
}

// Load reads every file (format detected per file, see DetectFormat), checks
// the data, merges adjacent ranges that carry the same ASN and country, and
// returns the minimal CIDR table.
//
// Any malformed line, overlapping ranges or unreadable file rejects the whole
// load: Load returns a nil table and an error, so the caller keeps the data it
// had. Data problems come as *LoadError (errors.Is(err, ErrRejected)), with up
// to MaxProblems problems, each with file:line.
func Load(ctx context.Context, paths []string, opts Options) (*Table, error) {
	if len(paths) == 0 {
		return nil, errors.New("load asn data: no files given")
	}
	if len(paths) > 1<<16 {
		return nil, fmt.Errorf("load asn data: %d files given, at most %d supported", len(paths), 1<<16)
	}
	b := newBuilder(paths, opts)
	var total, textBytes int64
	formats := make([]Format, len(paths))
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("load asn data: %w", err)
		}
		total += fi.Size()
		if formats[i], err = DetectFormat(p); err != nil {
			return nil, fmt.Errorf("load asn data: %w", err)
		}
		switch formats[i] {
		case FormatTSV:
			textBytes += fi.Size()
		case FormatTSVGzip:
			textBytes += gzipSizeHint(p, fi.Size())
		}
	}
	b.progress = progressTracker{fn: opts.Progress, total: total}
	// iptoasn lines average 40-60 bytes: reserve so appends do not copy a
	// 500k-range table several times over. The cap bounds what a wrong hint
	// can cost (4 Mi spans = 192 MiB).
	b.spans = make([]span, 0, min(textBytes/48, 4<<20))
	b.stats.Bytes = total
	for i, p := range paths {
		var err error
		switch formats[i] {
		case FormatMMDB:
			err = b.readMMDB(ctx, uint16(i), p)
		default:
			err = b.readTSVFile(ctx, uint16(i), p)
		}
		if err != nil {
			return nil, fmt.Errorf("load asn data: %w", err)
		}
		b.stats.Files++
		if b.full() {
			break
		}
	}
	t, err := b.build()
	if err != nil {
		return nil, fmt.Errorf("load asn data: %w", err)
	}
	b.progress.finish()
	return t, nil
}

// span is one input range before merging. 48 bytes.
type span struct {
	start, end u128
	asn        uint32
	line       uint32 // 0 for MaxMind DB networks
	file       uint16
	country    [2]byte
	is6        bool
}

type builder struct {
	paths       []string
	maxProblems int
	spans       []span
	problems    []Problem
	more        bool
	stats       Stats
	progress    progressTracker
}

func newBuilder(paths []string, opts Options) *builder {
	maxProblems := opts.MaxProblems
	if maxProblems <= 0 {
		maxProblems = DefaultMaxProblems
	}
	return &builder{paths: paths, maxProblems: maxProblems}
}

func (b *builder) full() bool { return len(b.problems) >= b.maxProblems }

// problem records a defect; once the limit is reached further ones only set more.
func (b *builder) problem(file uint16, line uint32, format string, args ...any) {
	if b.full() {
		b.more = true
		return
	}
	b.problems = append(b.problems, Problem{File: b.paths[file], Line: int(line), Msg: fmt.Sprintf(format, args...)})
}

func (b *builder) rejection() error {
	if len(b.problems) == 0 {
		return nil
	}
	return &LoadError{Problems: b.problems, More: b.more}
}

func (b *builder) where(s span) string {
	if s.line == 0 {
		return fmt.Sprintf("%s network %v-%v", b.paths[s.file], s.start.addr(s.is6), s.end.addr(s.is6))
	}
	return fmt.Sprintf("%s:%d", b.paths[s.file], s.line)
}

func spanCmp(a, b span) int {
	if a.is6 != b.is6 {
		if a.is6 {
			return 1
		}
		return -1
	}
	return a.start.cmp(b.start)
}

// build sorts the spans, rejects overlaps, merges contiguous spans with equal
// ASN and country, and cuts each merged run into its minimal CIDR list. Runs
// are maximal, so no entry could be merged with a neighbour: the result is the
// smallest set of disjoint prefixes carrying the same address→(ASN, country) map.
func (b *builder) build() (*Table, error) {
	if err := b.rejection(); err != nil {
		return nil, err
	}
	// iptoasn files come sorted; sort only when needed (several files, mmdb).
	if !slices.IsSortedFunc(b.spans, spanCmp) {
		slices.SortStableFunc(b.spans, spanCmp)
	}
	// Merge in place: merged never grows past the element being read.
	merged := b.spans[:0]
	var prevLine span // the previous input span as read, for messages
	for i, s := range b.spans {
		if i > 0 {
			run := &merged[len(merged)-1]
			if run.is6 == s.is6 && s.start.cmp(run.end) <= 0 {
				b.problem(s.file, s.line, "range %v-%v overlaps range %v-%v from %s",
					s.start.addr(s.is6), s.end.addr(s.is6),
					prevLine.start.addr(s.is6), prevLine.end.addr(s.is6), b.where(prevLine))
				if b.full() {
					b.more = i < len(b.spans)-1
					break
				}
				prevLine = s
				continue
			}
			if run.is6 == s.is6 && run.asn == s.asn && run.country == s.country && run.end.addOne() == s.start {
				run.end = s.end
				prevLine = s
				continue
			}
		}
		merged = append(merged, s)
		prevLine = s
	}
	if err := b.rejection(); err != nil {
		return nil, err
	}
	n := 0
	for _, s := range merged {
		forEachRangeBlock(s.start, s.end, s.is6, func(u128, int) { n++ })
	}
	entries := make([]Entry, 0, n)
	for _, s := range merged {
		bitsTotal := familyBits(s.is6)
		forEachRangeBlock(s.start, s.end, s.is6, func(first u128, hostBits int) {
			entries = append(entries, Entry{
				Prefix:  netipPrefix(first, s.is6, bitsTotal-hostBits),
				ASN:     s.asn,
				Country: s.country,
			})
		})
	}
	b.spans = nil
	return newTableSorted(entries, b.stats), nil
}

// progressTracker throttles Progress calls to about one per MiB.
type progressTracker struct {
	fn         func(done, total int64)
	total      int64
	done       int64
	lastReport int64
}

const progressStep = 1 << 20

func (p *progressTracker) add(n int64) {
	p.done += n
	if p.fn != nil && p.done-p.lastReport >= progressStep {
		p.lastReport = p.done
		p.fn(min(p.done, p.total), p.total)
	}
}

func (p *progressTracker) finish() {
	if p.fn != nil {
		p.fn(p.total, p.total)
	}
}

// countingReader feeds bytes read from the file into the progress tracker.
type countingReader struct {
	r io.Reader
	p *progressTracker
	n int64
}

func (c *countingReader) Read(buf []byte) (int, error) {
	n, err := c.r.Read(buf)
	c.n += int64(n)
	c.p.add(int64(n))
	return n, err
}

// setDone moves progress forward to an absolute position; it never goes back.
func (p *progressTracker) setDone(done int64) {
	if done > p.done {
		p.add(done - p.done)
	}
}

// gzipSizeHint estimates the uncompressed size of a gzip file from its
// trailer (ISIZE, the size modulo 2^32 of the last member). It is a capacity
// hint only; a value below the compressed size falls back to 4x that size.
func gzipSizeHint(path string, compressed int64) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var trailer [4]byte
	if compressed < 18 {
		return 0
	}
	if _, err := f.ReadAt(trailer[:], compressed-4); err != nil {
		return 0
	}
	isize := int64(binary.LittleEndian.Uint32(trailer[:]))
	if isize < compressed {
		return 4 * compressed
	}
	return isize
}
