package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"131072", 131072, ""},
		{"4096B", 4096, ""},
		{"128KiB", 128 << 10, ""},
		{"128kib", 128 << 10, ""},
		{"1MiB", 1 << 20, ""},
		{"1M", 1 << 20, ""},
		{"2GiB", 2 << 30, ""},
		{" 3 KiB ", 3 << 10, ""},
		{"10MB", 10_000_000, ""},
		{"1kB", 1000, ""},
		{"2GB", 2_000_000_000, ""},
		{"99999999999TB", 0, "too large"},
		{"1.5MiB", 0, "unknown unit"},
		{"KiB", 0, "want a byte count"},
		{"", 0, "want a byte count"},
		{"-1", 0, "want a byte count"},
		{"99999999999TiB", 0, "too large"},
	} {
		got, err := parseSize(tc.in)
		if tc.err == "" && (err != nil || got != tc.want) {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("parseSize(%q) = %d, %v; want error %q", tc.in, got, err, tc.err)
		}
	}
	for _, n := range []int64{1, 1000, 1024, 128 << 10, 1<<20 + 1, 5 << 30} {
		if got, err := parseSize(formatSize(n)); err != nil || got != n {
			t.Errorf("parseSize(formatSize(%d) = %q) = %d, %v", n, formatSize(n), got, err)
		}
	}
}

func TestOpenEngineURLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		role tierRole
		url  string
		bad  string // "" means it opens
	}{
		{roleKV, "mem:", ""},
		{roleLarge, "mem:", ""},
		{roleKV, "none", ""},
		{roleKV, "mem:x", "takes no argument"},
		{roleKV, "none:", "takes no argument"},
		{roleKV, "sqlite:", "want sqlite:PATH"},
		{roleLarge, "local:", "want local:DIR"},
		{roleLarge, "sqlite:/x", "kv-tier engine"},
		{roleKV, "local:/x", "large-tier engine"},
		{roleLarge, "postgres://h/db", "kv-tier engine"},
		{roleKV, "postgresql://h:notaport/db", "invalid PostgreSQL DSN"},
		{roleKV, "pglo:postgres://h/db", "large-tier engine"},
		{roleLarge, "pglo:", "want pglo:postgres://"},
		{roleKV, "s3://bucket", "large-tier engine"},
		{roleLarge, "s3://bucket/p", "no endpoint"},
		{roleLarge, "s3://key:secret@bucket/p?endpoint=h:1", "credentials do not go in the URL"},
		{roleKV, "ftp://x", "unknown engine"},
		{roleKV, "/some/path", "unknown engine"},
	} {
		e, err := openEngine(ctx, tc.role, tc.url, nil)
		var bad *badURLError
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("openEngine(%s, %q): %v", tc.role, tc.url, err)
		case tc.bad != "" && (!errors.As(err, &bad) || !strings.Contains(bad.msg, tc.bad)):
			t.Errorf("openEngine(%s, %q) = %v, want a bad URL error %q", tc.role, tc.url, err, tc.bad)
		}
		if e != nil {
			e.Close()
		}
	}
}

func TestExitCodeMapping(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{errors.New("disk on fire"), 1},
		{fmt.Errorf("x: %w", store.ErrMissing), 1},
		{fmt.Errorf("x: %w", store.ErrVerification), 1},
		{&usageError{err: errors.New("bad")}, 2},
		{fmt.Errorf("parse: %w", store.ErrKeyInvalid), 2},
		{fmt.Errorf("ns: %w", namespaces.ErrBadName), 2},
		{fmt.Errorf("ns: %w", namespaces.ErrNotFound), 1},
		{errors.Join(errors.New("a"), errors.New("b")), 1},
	} {
		var buf bytes.Buffer
		if got := exitCode(&buf, tc.err); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
		if tc.err != nil && (strings.Count(buf.String(), "\n") != 1 || !strings.HasPrefix(buf.String(), "alkblobfs: ")) {
			t.Errorf("exitCode(%v) printed %q, want one line", tc.err, buf.String())
		}
	}
}

func TestTransferProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 3 << 20
	for _, tc := range []struct {
		name    string
		term    bool
		size    int64
		wantBar bool
	}{
		{"terminal, known size", true, n, true},
		{"terminal, unknown size", true, -1, true},
		{"not a terminal", false, n, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bar bytes.Buffer
			tr := newTransfer(ctx, &bar, tc.term, tc.size, "put")
			got, err := io.Copy(io.Discard, tr.reader(bytes.NewReader(make([]byte, n))))
			tr.done(err)
			if err != nil || got != n {
				t.Fatalf("copy = %d, %v", got, err)
			}
			if tc.wantBar != (bar.Len() > 0) {
				t.Fatalf("bar output %q, want bar %v", bar.String(), tc.wantBar)
			}
			if tc.wantBar && (!strings.Contains(bar.String(), "MiB") || !strings.HasSuffix(bar.String(), "\n")) {
				t.Errorf("bar output %q: want byte counts and a final newline", bar.String())
			}
		})
	}
	// Small transfers draw nothing even on a terminal.
	var bar bytes.Buffer
	tr := newTransfer(ctx, &bar, true, 1000, "put")
	io.Copy(tr.writer(io.Discard), bytes.NewReader(make([]byte, 1000)))
	tr.done(nil)
	if bar.Len() != 0 {
		t.Errorf("a 1000-byte transfer drew %q", bar.String())
	}
	// A cancelled context stops the copy.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	tr = newTransfer(cctx, io.Discard, false, -1, "put")
	if _, err := io.Copy(io.Discard, tr.reader(bytes.NewReader(make([]byte, 10)))); !errors.Is(err, context.Canceled) {
		t.Errorf("copy after cancel: %v", err)
	}
}

func TestPrintReport(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	printReport(&buf, gc.Report{Scanned: 10, Live: 7, Queued: 3, Deleted: 2, Cancelled: 1, BytesFreed: 3 << 20, Durable: true, Delay: time.Minute, Duration: 1500 * time.Microsecond})
	for _, want := range []string{"scanned    10 blobs, 7 live\n", "queued     3 candidates\n", "deleted    2 (3.0 MiB freed)\n", "cancelled  1 by arbitration\n", "durable window (delay 1m0s)", "duration   1.5ms\n"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report %q lacks %q", buf.String(), want)
		}
	}
	buf.Reset()
	printReport(&buf, gc.Report{Aborted: gc.AbortProtectFailed, Detail: "callback: boom"})
	if got := buf.String(); !strings.HasPrefix(got, "sweep aborted: ProtectFailed: the protect callback failed; nothing deleted\n") || !strings.Contains(got, "boom") {
		t.Errorf("aborted report %q", got)
	}
}
