package textout

import (
	"errors"
	"strings"
	"testing"
)

// failAfter accepts n writes, then fails every one.
type failAfter struct {
	n      int
	writes int
	buf    strings.Builder
}

var errFull = errors.New("full")

func (f *failAfter) Write(b []byte) (int, error) {
	f.writes++
	if f.writes > f.n {
		return 0, errFull
	}
	return f.buf.Write(b)
}

func TestWriterRemembersTheFirstError(t *testing.T) {
	f := &failAfter{n: 1}
	p := New(f)
	p.Printf("a%d\n", 1)
	p.Println("b")
	p.Print("c")
	if !errors.Is(p.Err(), errFull) || !errors.Is(p.Flush(), errFull) {
		t.Fatalf("err %v, flush %v: want %v", p.Err(), p.Flush(), errFull)
	}
	if f.writes != 2 {
		t.Errorf("%d writes reached the writer, want 2: none after the failed one", f.writes)
	}
	if got := f.buf.String(); got != "a1\n" {
		t.Errorf("wrote %q, want %q", got, "a1\n")
	}
}

func TestTableAlignsOnFlush(t *testing.T) {
	var b strings.Builder
	tw := Table(&b, 0, 0, 2, ' ', 0)
	tw.Println("NAME\tGPUS")
	tw.Printf("%s\t%d\n", "node-1", 8)
	if b.Len() != 0 {
		t.Fatalf("wrote %q before Flush", b.String())
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	if want := "NAME    GPUS\nnode-1  8\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

func TestTableFlushError(t *testing.T) {
	tw := Table(&failAfter{}, 0, 0, 2, ' ', 0)
	tw.Println("a\tb")
	if err := tw.Flush(); !errors.Is(err, errFull) {
		t.Fatalf("flush: %v, want %v", err, errFull)
	}
}
