package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toposched/toposched/events"
)

// YAMLToJSON turns a YAML document (or JSON, which is YAML) into JSON for
// the events decoder and the schemas, keeping numbers as they were
// written: 8.0 stays 8.0 and 1e30 stays 1e30, so that a message about a
// number quotes the user's own, and an integer of 64 bits passes without
// going through a float. Anchors, aliases and merge keys (<<) are
// resolved. A value JSON cannot carry (.inf, .nan, a key that is not a
// string) is refused naming its field as the schemas do.
func YAMLToJSON(data []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	c := converter{buf: &buf}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	if root.Kind == 0 || root.Kind == yaml.DocumentNode {
		return []byte("null"), nil // an empty document
	}
	if err := c.node(root, "", 0); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// maxYAMLDepth bounds nesting (and alias chains): no event is deep.
const maxYAMLDepth = 64

// maxYAMLJSON bounds the JSON a document turns into.
const maxYAMLJSON = events.MaxMessageBytes

type converter struct {
	buf *bytes.Buffer
}

// jsonNumber is the grammar of a JSON number.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

func (c *converter) node(n *yaml.Node, field string, depth int) error {
	if depth > maxYAMLDepth {
		return fmt.Errorf("%s: nested more than %d deep", where(field), maxYAMLDepth)
	}
	if c.buf.Len() > maxYAMLJSON {
		// Aliases can make a small document huge: no event is bigger
		// than a message.
		return fmt.Errorf("the document is over %d bytes as JSON, more than one message holds", maxYAMLJSON)
	}
	switch n.Kind {
	case yaml.AliasNode:
		return c.node(n.Alias, field, depth+1)
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			c.buf.WriteString("null")
			return nil
		}
		return c.node(n.Content[0], field, depth+1)
	case yaml.SequenceNode:
		c.buf.WriteByte('[')
		for i, e := range n.Content {
			if i > 0 {
				c.buf.WriteByte(',')
			}
			if err := c.node(e, field+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
		c.buf.WriteByte(']')
		return nil
	case yaml.MappingNode:
		pairs, err := mappingPairs(n, field, depth)
		if err != nil {
			return err
		}
		c.buf.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				c.buf.WriteByte(',')
			}
			k, _ := json.Marshal(p.key)
			c.buf.Write(k)
			c.buf.WriteByte(':')
			if err := c.node(p.value, appendKey(field, p.key), depth+1); err != nil {
				return err
			}
		}
		c.buf.WriteByte('}')
		return nil
	case yaml.ScalarNode:
		return c.scalar(n, field)
	}
	return fmt.Errorf("%s: a YAML node of kind %d cannot be JSON", where(field), n.Kind)
}

func (c *converter) scalar(n *yaml.Node, field string) error {
	switch n.ShortTag() {
	case "!!null":
		c.buf.WriteString("null")
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return fmt.Errorf("%s: %s is not true or false", where(field), strconv.Quote(n.Value))
		}
		c.buf.WriteString(strconv.FormatBool(b))
	case "!!int", "!!float":
		if jsonNumber.MatchString(n.Value) {
			c.buf.WriteString(n.Value)
			return nil
		}
		// YAML's other spellings: +1, 0x1F, 0o17, 1_000, .5, 1., .inf.
		s := strings.ReplaceAll(strings.TrimPrefix(n.Value, "+"), "_", "")
		if i, err := strconv.ParseInt(s, 0, 64); err == nil {
			c.buf.WriteString(strconv.FormatInt(i, 10))
			return nil
		}
		if u, err := strconv.ParseUint(s, 0, 64); err == nil {
			c.buf.WriteString(strconv.FormatUint(u, 10))
			return nil
		}
		var f float64
		if err := n.Decode(&f); err != nil {
			return fmt.Errorf("%s: %s is not a number", where(field), strconv.Quote(n.Value))
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("%s is not a finite number: %s", where(field), n.Value)
		}
		c.buf.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	default:
		// Strings, and what JSON has no type for (timestamps, binary):
		// their text, as written.
		s, _ := json.Marshal(n.Value)
		c.buf.Write(s)
	}
	return nil
}

type pair struct {
	key   string
	value *yaml.Node
}

// mappingPairs lists a mapping's keys and values in order, merge keys
// resolved: a key of the mapping itself wins over a merged one, and an
// earlier merged mapping over a later one.
func mappingPairs(n *yaml.Node, field string, depth int) ([]pair, error) {
	if depth > maxYAMLDepth {
		return nil, fmt.Errorf("%s: nested more than %d deep", where(field), maxYAMLDepth)
	}
	var own, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		for k.Kind == yaml.AliasNode {
			k = k.Alias
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			var sources []*yaml.Node
			for v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			switch v.Kind {
			case yaml.MappingNode:
				sources = []*yaml.Node{v}
			case yaml.SequenceNode:
				sources = v.Content
			default:
				return nil, fmt.Errorf("%s: a merge key (<<) takes a mapping or a list of them", where(field))
			}
			for _, src := range sources {
				for src.Kind == yaml.AliasNode {
					src = src.Alias
				}
				if src.Kind != yaml.MappingNode {
					return nil, fmt.Errorf("%s: a merge key (<<) takes a mapping or a list of them", where(field))
				}
				ps, err := mappingPairs(src, field, depth+1)
				if err != nil {
					return nil, err
				}
				merged = append(merged, ps...)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			return nil, errors.New(where(field) + ": a key must be a string, not a list or a mapping")
		}
		own = append(own, pair{k.Value, v})
	}
	seen := make(map[string]bool, len(own))
	for _, p := range own {
		seen[p.key] = true
	}
	out := own
	for _, p := range merged {
		if !seen[p.key] {
			seen[p.key] = true
			out = append(out, p)
		}
	}
	return out, nil
}

func where(field string) string {
	if field == "" {
		return "the document"
	}
	return field
}

// simpleKey is a property name that reads unambiguously after a dot.
var simpleKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// appendKey adds a property to a dotted path as the schemas do.
func appendKey(field, key string) string {
	switch {
	case !simpleKey.MatchString(key):
		return field + "[" + strconv.Quote(key) + "]"
	case field == "":
		return key
	default:
		return field + "." + key
	}
}
