package fabric

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
)

// Tiers of events.Switch.
const (
	TierLeaf  = "leaf"
	TierSpine = "spine"
	TierCore  = "core"
)

// nodeNamePattern is the cluster file's node name: a fabric node must be
// named as its cluster file entry is.
var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// switchNamePattern also admits ':' (switch names are often GUIDs or
// port-qualified); the length is checked by each parser.
var switchNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

// problems collects errors with their lines, to report them in line order.
type problems struct {
	file string
	list []lineError
}

type lineError struct {
	line int
	seq  int
	msg  string
}

func (p *problems) add(line int, format string, args ...any) {
	p.list = append(p.list, lineError{line: line, seq: len(p.list), msg: fmt.Sprintf(format, args...)})
}

func (p *problems) empty() bool { return len(p.list) == 0 }

// err joins the problems, in line order, each as "file:line: message".
func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	slices.SortFunc(p.list, func(a, b lineError) int {
		return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.seq, b.seq))
	})
	errs := make([]error, len(p.list))
	for i, e := range p.list {
		errs[i] = fmt.Errorf("%s:%d: %s", p.file, e.line, e.msg)
	}
	return errors.Join(errs...)
}

// abbreviate shortens a long value for an error message.
func abbreviate(s string) string {
	const most = 80
	if len(s) <= most {
		return s
	}
	return s[:most] + "..."
}
