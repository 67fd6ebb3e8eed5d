package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// Class is the kind of the best path between two devices of a node,
// ordered best first.
type Class uint8

// Path classes.
const (
	Unknown Class = iota
	Self
	NV
	NVB
	PIX
	PXB
	PHB
	NODE
	SYS
	NET
)

var classNames = [...]string{"?", "X", "NV", "NVB", "PIX", "PXB", "PHB", "NODE", "SYS", "NET"}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", c)
}

// NVLink reports whether the path runs over NVLink.
func (c Class) NVLink() bool { return c == NV || c == NVB }

// Link is one cell of a node's matrix: the path class and, for NV, the
// number of bonded NVLinks.
type Link struct {
	Class   Class `json:"class"`
	NVLinks int   `json:"nvlinks,omitempty"`
}

// String renders a link as nvidia-smi does: X, NV12, PIX, ...
func (l Link) String() string {
	if l.Class == NV {
		return "NV" + strconv.Itoa(l.NVLinks)
	}
	return l.Class.String()
}

// MarshalText renders the link as nvidia-smi does, so JSON shows "NV12".
func (l Link) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads a link written by MarshalText.
func (l *Link) UnmarshalText(b []byte) error {
	v, err := ParseLink(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// ParseLink reads one nvidia-smi matrix cell: X, NV#, NVB, PIX, PXB, PHB,
// NODE, SYS, NET (older drivers also print SOC for SYS).
func ParseLink(s string) (Link, error) {
	s = strings.TrimSpace(s)
	switch strings.ToUpper(s) {
	case "X":
		return Link{Class: Self}, nil
	case "NVB":
		return Link{Class: NVB}, nil
	case "PIX":
		return Link{Class: PIX}, nil
	case "PXB":
		return Link{Class: PXB}, nil
	case "PHB":
		return Link{Class: PHB}, nil
	case "NODE":
		return Link{Class: NODE}, nil
	case "SYS", "SOC":
		return Link{Class: SYS}, nil
	case "NET":
		return Link{Class: NET}, nil
	}
	if rest, ok := strings.CutPrefix(strings.ToUpper(s), "NV"); ok {
		n, err := strconv.Atoi(rest)
		if err == nil && n > 0 && n <= 64 {
			return Link{Class: NV, NVLinks: n}, nil
		}
	}
	return Link{}, fmt.Errorf("%q: expected X, NV#, NVB, PIX, PXB, PHB, NODE or SYS", s)
}
