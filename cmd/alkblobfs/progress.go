package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressMin is the transfer size from which a progress bar is worth its
// screen line: below ~1 MiB a transfer ends before a rate means anything.
const progressMin = 1 << 20

// transfer follows one put or get: it stops the copy when ctx ends (the
// store's readers do not watch ctx) and, when w is a terminal, draws a
// progress bar on it once the transfer is known or seen to pass
// progressMin.
type transfer struct {
	ctx  context.Context
	w    io.Writer // nil: no bar
	size int64     // -1: unknown
	desc string
	n    int64
	bar  *progressbar.ProgressBar
}

// newTransfer starts following a transfer of size bytes (-1 unknown). The
// bar goes to w only when term is true.
func newTransfer(ctx context.Context, w io.Writer, term bool, size int64, desc string) *transfer {
	t := &transfer{ctx: ctx, size: size, desc: desc}
	if term {
		t.w = w
	}
	return t
}

func (t *transfer) add(n int) {
	t.n += int64(n)
	if t.w != nil {
		if t.bar == nil && (t.size > progressMin || t.n > progressMin) {
			t.bar = newBar(t.w, t.size, t.desc)
			t.bar.Add64(t.n - int64(n))
		}
		if t.bar != nil {
			t.bar.Add64(int64(n))
		}
	}
}

// reader counts what is read from r.
func (t *transfer) reader(r io.Reader) io.Reader { return &transferReader{t, r} }

// writer counts what is written to w.
func (t *transfer) writer(w io.Writer) io.Writer { return &transferWriter{t, w} }

// done ends the bar, full on success, where it stopped on failure, and
// moves to a fresh line so that the next output starts clean.
func (t *transfer) done(err error) {
	if t.bar == nil {
		return
	}
	if err == nil {
		t.bar.Finish()
	} else {
		t.bar.Exit()
	}
	fmt.Fprintln(t.w)
}

type transferReader struct {
	t *transfer
	r io.Reader
}

func (tr *transferReader) Read(p []byte) (int, error) {
	if err := tr.t.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := tr.r.Read(p)
	tr.t.add(n)
	return n, err
}

type transferWriter struct {
	t *transfer
	w io.Writer
}

func (tw *transferWriter) Write(p []byte) (int, error) {
	if err := tw.t.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := tw.w.Write(p)
	tw.t.add(n)
	return n, err
}

// newBar is progressbar.DefaultBytes (bytes, rate, time left) on w instead
// of os.Stderr, without its completion hook: done prints the newline, for
// the failed case too.
func newBar(w io.Writer, size int64, desc string) *progressbar.ProgressBar {
	return progressbar.NewOptions64(size,
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWriter(w),
		progressbar.OptionShowBytes(true),
		progressbar.OptionUseIECUnits(true), // MiB, as everywhere else
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionSetWidth(10),
		progressbar.OptionThrottle(65*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionFullWidth(),
		progressbar.OptionSetRenderBlankState(true),
	)
}
