// Package textout is the writer that reports and commands print through:
// it remembers the first error of its writes, so that a renderer making
// many prints checks none of them and returns that one error at the end.
// After a failed write it writes nothing more.
package textout

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Writer prints to an io.Writer and remembers the first error.
type Writer struct {
	w     io.Writer
	flush func() error // a Table's tabwriter
	err   error
}

// New prints to w.
func New(w io.Writer) *Writer { return &Writer{w: w} }

// Table prints to w through a text/tabwriter with these settings (see
// tabwriter.NewWriter): cells end with tabs, rows with newlines, and Flush
// writes the aligned table.
func Table(w io.Writer, minwidth, tabwidth, padding int, padchar byte, flags uint) *Writer {
	tw := tabwriter.NewWriter(w, minwidth, tabwidth, padding, padchar, flags)
	return &Writer{w: tw, flush: tw.Flush}
}

// Write writes p unless an earlier write failed; it returns the first
// error.
func (p *Writer) Write(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	n, err := p.w.Write(b)
	p.err = err
	return n, err
}

// The print methods drop fmt's error: Write has remembered it, and Err and
// Flush return it.

// Printf prints as fmt.Fprintf.
func (p *Writer) Printf(format string, args ...any) { _, _ = fmt.Fprintf(p, format, args...) }

// Println prints as fmt.Fprintln.
func (p *Writer) Println(args ...any) { _, _ = fmt.Fprintln(p, args...) }

// Print prints as fmt.Fprint.
func (p *Writer) Print(args ...any) { _, _ = fmt.Fprint(p, args...) }

// Err is the first error of the writes so far.
func (p *Writer) Err() error { return p.err }

// Flush writes out a Table (a plain Writer writes as it goes) and returns
// the first error of all the writes.
func (p *Writer) Flush() error {
	if p.err == nil && p.flush != nil {
		p.err = p.flush()
	}
	return p.err
}
