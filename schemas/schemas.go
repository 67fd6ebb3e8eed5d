// Package schemas holds the JSON Schemas (draft 2020-12) of toposched's
// events, one per event name of the events catalogue, with example payloads,
// and validates event bodies against them.
//
// The schemas are the contract for publishers that are not written in Go;
// the tests prove that every Go type in package events matches its schema.
// They live in v1/<name>.schema.json, with definitions shared between events
// in v1/common.schema.json, and examples in v1/examples/<name>/ (valid) and
// v1/examples/<name>/invalid/ (each must fail). Every schema has an absolute
// $id under BaseURL so that references resolve the same wherever the files
// are served from.
package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// FS holds the v1 directory: the schemas and their examples.
//
//go:embed v1
var FS embed.FS

// BaseURL is the prefix of every schema's $id; the file name follows it.
const BaseURL = "https://toposched.dev/schemas/v1/"

// Common is the name of the schema of shared definitions. It is not an event:
// Schema returns it, Validate and Names do not know it.
const Common = "common"

const (
	dir    = "v1"
	suffix = ".schema.json"
)

// ErrUnknownEvent is returned (wrapped) for a name that has no schema.
var ErrUnknownEvent = errors.New("unknown event")

// Problem is one reason a body does not match its schema.
type Problem struct {
	// Field is the dotted JSON path of the value at fault, such as
	// "parallelism.tp" or "ranks[3].gpu"; "" is the whole body. For a missing
	// or unexpected property it names that property.
	Field string
	// Rule is the JSON Schema keyword that failed (required, minimum,
	// pattern, additionalProperties, type, enum, format, ...), or "json" when
	// the body is not JSON or repeats a property, "number" when a number
	// is out of any range an event field can hold, "depth" when arrays and
	// objects nest past MaxDepth, and "size" when a body too large for the
	// library is one the fast path cannot decide.
	Rule string
	// Message says what is wrong, for people.
	Message string
}

func (p Problem) String() string {
	f := p.Field
	if f == "" {
		f = "(root)"
	}
	return f + ": " + p.Rule + ": " + p.Message
}

// ValidationError lists every problem found in a body, sorted by field then
// rule.
type ValidationError struct {
	Problems []Problem
}

// maxErrorLines bounds the problems Error lists (Problems holds them all):
// the text travels in a dead letter's toposched-error header, and a body
// with a problem in each of a million ranks must not make a header that
// NATS will not carry.
const maxErrorLines = 100

func (e *ValidationError) Error() string {
	n := min(len(e.Problems), maxErrorLines)
	lines := make([]string, n, n+1)
	for i, p := range e.Problems[:n] {
		lines[i] = p.String()
	}
	if more := len(e.Problems) - n; more > 0 {
		lines = append(lines, fmt.Sprintf("and %d more problems", more))
	}
	return strings.Join(lines, "\n")
}

// Names returns the event names that have a schema, sorted.
func Names() []string {
	files, err := fs.Glob(FS, dir+"/*"+suffix)
	if err != nil {
		// The pattern is a constant and well formed.
		panic(fmt.Sprintf("schemas: glob: %v", err))
	}
	var names []string
	for _, f := range files {
		if n := strings.TrimSuffix(path.Base(f), suffix); n != Common {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// Schema returns the text of the schema of the named event, or of the shared
// definitions for Common.
func Schema(name string) ([]byte, error) {
	if !validName(name) {
		return nil, fmt.Errorf("schemas: %q: %w", name, ErrUnknownEvent)
	}
	b, err := FS.ReadFile(dir + "/" + name + suffix)
	if err != nil {
		return nil, fmt.Errorf("schemas: %q: %w", name, ErrUnknownEvent)
	}
	return b, nil
}

// validName keeps names from walking the embedded tree ("../x", "examples/..").
func validName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\\") && name != "." && name != ".."
}

// compiled holds every event schema, compiled once on first use: compiling
// costs milliseconds and most programs validate only a few kinds of event.
var compiled = sync.OnceValues(compile)

func compile() (map[string]*jsonschema.Schema, error) {
	files, err := fs.Glob(FS, dir+"/*"+suffix)
	if err != nil {
		return nil, fmt.Errorf("schemas: glob: %w", err)
	}
	c := jsonschema.NewCompiler()
	// Draft 2020-12 only annotates formats by default; date-time must be
	// checked, since Go refuses a time.Time that is not RFC 3339.
	c.AssertFormat()
	// Every reference is to a resource added here; a schema that reached for
	// the network or the file system would be a bug, so refuse it.
	c.UseLoader(jsonschema.SchemeURLLoader{})
	// Plain numeric schemas are checked by this package's vocabulary
	// (numbers.go), in machine arithmetic where it is exact.
	c.RegisterVocabulary(numberVocab)
	// And uniqueItems by one key per item (unique.go).
	c.RegisterVocabulary(uniqueVocab)
	c.AssertVocabs()
	for _, f := range files {
		b, err := FS.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("schemas: read %s: %w", f, err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schemas: parse %s: %w", f, err)
		}
		// Insist that $id matches the file, so that a copied schema cannot
		// silently shadow another.
		want := BaseURL + path.Base(f)
		if obj, ok := doc.(map[string]any); !ok || obj["$id"] != want {
			return nil, fmt.Errorf("schemas: %s: $id must be %s", f, want)
		}
		rewriteNumbers(doc)
		rewriteUnique(doc)
		if err := c.AddResource(want, doc); err != nil {
			return nil, fmt.Errorf("schemas: add %s: %w", f, err)
		}
	}
	m := make(map[string]*jsonschema.Schema)
	for _, n := range Names() {
		s, err := c.Compile(BaseURL + n + suffix)
		if err != nil {
			return nil, fmt.Errorf("schemas: compile %s: %w", n, err)
		}
		m[n] = s
	}
	return m, nil
}

// Validate checks body against the schema of the named event, such as
// "jobs.submitted". It returns nil, a *ValidationError, or another error
// when name is unknown (wrapping ErrUnknownEvent).
//
// Its cost is bounded whatever the body (fast.go): a body of at most
// maxLibraryValues values gets every problem the library finds; a larger
// one the first problem met in reading it, found without building a
// document, such as the first array past its maxItems (where reading
// stops) or nesting past MaxDepth.
func Validate(name string, body []byte) error {
	m, err := compiled()
	if err != nil {
		return err
	}
	s, ok := m[name]
	if !ok {
		return fmt.Errorf("schemas: %q: %w", name, ErrUnknownEvent)
	}
	var fast *fastSchema
	if programs, err := fastPrograms(); err == nil {
		fast = programs[name]
	}
	return validate(name, s, fast, body)
}

// validate is Validate with the event's schema and fast path (nil: none,
// and the body is only measured before the library reads it).
func validate(name string, s *jsonschema.Schema, fast *fastSchema, body []byte) error {
	verdict, p, values := readFast(fast, body)
	switch {
	case verdict == passes:
		return nil
	case values <= maxLibraryValues && len(body) <= maxLibraryBytes:
		return validateWith(name, s, body)
	case verdict == fails:
		return newValidationError([]Problem{p})
	}
	return newValidationError([]Problem{{Rule: "size", Message: printer.Sprintf(
		"the body holds %d values, more than the %d of a body the quick check cannot decide", values, maxLibraryValues)}})
}

// maxLibraryValues and maxLibraryBytes bound a body the library reads:
// it builds a document of it and a problem per value at fault, about a
// kilobyte and a few microseconds a value (4 MB and 10 ms here), and
// quotes values in its messages. A body people write holds a few hundred
// values.
const (
	maxLibraryValues = 1 << 12
	maxLibraryBytes  = 1 << 20
)

// readFast is the fast path's verdict on body (f nil: none), with its
// problem, and how many values the body holds when the verdict is not a
// pass. The problems of reading come first, as decode reports them
// before the schema's: not JSON, a repeated property, a number out of
// range, nesting past MaxDepth.
func readFast(f *fastSchema, body []byte) (result, Problem, int) {
	verdict, p := undecided, Problem{}
	if f != nil {
		if verdict, p, _ = f.check(body); verdict == passes {
			return passes, p, 0
		}
	}
	if !json.Valid(body) {
		// Cheap to explain in full: decode's first check.
		return fails, notJSON(body), 0
	}
	r, rp, values := measure(body)
	if r != passes {
		return fails, rp, values
	}
	return verdict, p, values
}

// validateWith is Validate through the library alone.
func validateWith(name string, s *jsonschema.Schema, body []byte) error {
	doc, verr := decode(body)
	if verr != nil {
		return verr
	}
	err := s.Validate(doc)
	if err == nil {
		return nil
	}
	var jerr *jsonschema.ValidationError
	if !errors.As(err, &jerr) {
		return fmt.Errorf("schemas: validate %s: %w", name, err)
	}
	var probs []Problem
	collect(jerr, doc, &probs)
	return newValidationError(probs)
}

// decode parses body keeping numbers exact (json.Number), as the validator
// wants, and reports where it is not JSON, or is JSON that parsers read
// differently.
func decode(body []byte) (any, *ValidationError) {
	// Valid checks the whole body first, trailing data after the value
	// included, without allocating.
	if !json.Valid(body) {
		return nil, &ValidationError{Problems: []Problem{notJSON(body)}}
	}
	p := parsers.Get().(*parser)
	defer p.release()
	p.b = body
	doc := p.value()
	if len(p.probs) > 0 {
		return nil, newValidationError(p.probs)
	}
	return doc, nil
}

// notJSON says where a body json.Valid refuses is not JSON.
func notJSON(body []byte) Problem {
	var raw json.RawMessage
	msg := "not JSON"
	if err := json.Unmarshal(body, &raw); err != nil {
		msg = err.Error()
		var serr *json.SyntaxError
		if errors.As(err, &serr) {
			msg = fmt.Sprintf("not JSON at byte offset %d: %v", serr.Offset, serr)
		}
	}
	return Problem{Rule: "json", Message: msg}
}

// parser builds a document from a body json.Valid accepted, as a
// json.Decoder with UseNumber would (objects map[string]any, arrays []any,
// numbers json.Number, strings unescaped as encoding/json does), refusing
// what the validator and encoding/json would read differently:
//
//   - A repeated property: the validator sees only the last value, while
//     encoding/json decodes each in turn (and stops at the first it cannot),
//     so a body could pass here and fail in Go, or the reverse.
//   - Arrays and objects nested past MaxDepth: each is refused (rule
//     depth) and skipped unread, as fast.go refuses it.
//   - A number the validator cannot afford: it turns each into a big.Rat,
//     which takes time growing with the exponent (tens of milliseconds for
//     1e-999999, so a small body could hold seconds of work), and fails past
//     a few million, after which a minimum on a non-integer would dereference
//     nil. No event field holds such a number.
//
// It reads the bytes itself rather than a Decoder's tokens: every event
// published or consumed is checked, and the tokens cost half of the check.
// For the same reason it allocates only the document: where a value sits
// is a stack of steps, spelled out only for a problem, and each object's
// properties and array's elements wait on a stack until the map or slice
// can be made at its size (a map grown one property at a time is made
// again at 9); parsers, their stacks with them, are reused.
type parser struct {
	b       []byte
	i       int
	nesting int // arrays and objects open
	probs   []Problem
	// path is where the value being read sits: one step per enclosing
	// property or element.
	path []step
	// members and items hold the properties of the objects being read
	// and the elements of the arrays, innermost last.
	members []member
	items   []any
}

// step is one property (index -1) or array element on the way to a value.
type step struct {
	key   string
	index int
}

type member struct {
	key string
	val any
}

var parsers = sync.Pool{New: func() any { return new(parser) }}

// release empties p, keeping its stacks' room, and returns it to the pool.
func (p *parser) release() {
	clear(p.members[:cap(p.members)])
	clear(p.items[:cap(p.items)])
	*p = parser{path: p.path[:0], members: p.members[:0], items: p.items[:0]}
	parsers.Put(p)
}

// field spells out p.path, such as ranks[3].gpu; "" is the whole body.
func (p *parser) field() string {
	f := ""
	for _, s := range p.path {
		if s.index >= 0 {
			f += "[" + strconv.Itoa(s.index) + "]"
		} else {
			f = appendKey(f, s.key)
		}
	}
	return f
}

func (p *parser) space() { p.i = skipSpace(p.b, p.i) }

// skipSpace is where the JSON whitespace at b[i:] ends.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value reads one value at p.i.
func (p *parser) value() any {
	p.space()
	if c := p.b[p.i]; c == '{' || c == '[' {
		if p.nesting+1 > MaxDepth {
			p.probs = append(p.probs, Problem{Field: p.field(), Rule: "depth",
				Message: fmt.Sprintf("nested deeper than %d arrays and objects", MaxDepth)})
			p.i = skipValue(p.b, p.i)
			return nil
		}
		p.nesting++
		defer func() { p.nesting-- }()
	}
	switch c := p.b[p.i]; c {
	case '{':
		p.i++
		p.space()
		if p.b[p.i] == '}' {
			p.i++
			return map[string]any{}
		}
		base := len(p.members)
		for {
			p.space()
			key := p.str()
			p.space()
			p.i++ // :
			p.path = append(p.path, step{key: key, index: -1})
			v := p.value()
			p.path = p.path[:len(p.path)-1]
			p.members = append(p.members, member{key, v})
			p.space()
			if p.b[p.i] == ',' {
				p.i++
				continue
			}
			p.i++ // }
			break
		}
		obj := make(map[string]any, len(p.members)-base)
		for _, m := range p.members[base:] {
			if _, dup := obj[m.key]; dup {
				p.path = append(p.path, step{key: m.key, index: -1})
				p.probs = append(p.probs, Problem{Field: p.field(), Rule: "json", Message: "duplicate property"})
				p.path = p.path[:len(p.path)-1]
			}
			obj[m.key] = m.val
		}
		p.members = p.members[:base]
		return obj
	case '[':
		p.i++
		p.space()
		if p.b[p.i] == ']' {
			p.i++
			return []any{}
		}
		base := len(p.items)
		for n := 0; ; n++ {
			p.path = append(p.path, step{index: n})
			v := p.value()
			p.path = p.path[:len(p.path)-1]
			p.items = append(p.items, v)
			p.space()
			if p.b[p.i] == ',' {
				p.i++
				continue
			}
			p.i++ // ]
			break
		}
		arr := slices.Clone(p.items[base:])
		p.items = p.items[:base]
		return arr
	case '"':
		return p.str()
	case 't':
		p.i += len("true")
		return true
	case 'f':
		p.i += len("false")
		return false
	case 'n':
		p.i += len("null")
		return nil
	}
	start := p.i
	for p.i < len(p.b) && strings.IndexByte("+-0123456789.eE", p.b[p.i]) >= 0 {
		p.i++
	}
	lit := string(p.b[start:p.i])
	if !numberInRange(lit) {
		p.probs = append(p.probs, Problem{Field: p.field(), Rule: "number", Message: fmt.Sprintf("number %.40s out of range", lit)})
	}
	return json.Number(lit)
}

// skipValue is where the array or object at i of a valid body ends.
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
		case ']', '}':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return i
}

// str reads a string at p.i: plain ASCII as it is, anything else (escapes,
// other UTF-8, bytes that are not UTF-8) as encoding/json reads it.
func (p *parser) str() string {
	start := p.i
	p.i++ // "
	plain := true
	for ; ; p.i++ {
		c := p.b[p.i]
		if c == '\\' {
			plain = false
			p.i++ // the escaped byte: never the closing quote
			continue
		}
		if c >= utf8.RuneSelf {
			plain = false
		}
		if c == '"' {
			break
		}
	}
	p.i++
	if plain {
		return string(p.b[start+1 : p.i-1])
	}
	var s string
	_ = json.Unmarshal(p.b[start:p.i], &s) // a valid body's string
	return s
}

// Bounds of the numbers Validate accepts: past any float64, yet cheap for
// big.Rat.
const (
	maxNumberLen = 100
	maxExponent  = 400
)

// numberInRange reports whether a JSON number literal is short, has a modest
// exponent and does not overflow a float64.
func numberInRange(s string) bool {
	if len(s) > maxNumberLen {
		return false
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || e > maxExponent || e < -maxExponent {
			return false
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	return err == nil && !math.IsInf(f, 0)
}

// printer renders the validator's messages in English.
var printer = message.NewPrinter(language.English)

// collect appends a Problem for each leaf of the validator's error tree: the
// inner nodes (the schema, $ref, allOf, ...) only group their causes.
func collect(e *jsonschema.ValidationError, doc any, probs *[]Problem) {
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, p := range k.Missing {
			*probs = append(*probs, Problem{
				Field:   fieldPath(doc, append(e.InstanceLocation[:len(e.InstanceLocation):len(e.InstanceLocation)], p)),
				Rule:    "required",
				Message: "missing property",
			})
		}
		return
	case *kind.AdditionalProperties:
		for _, p := range k.Properties {
			*probs = append(*probs, Problem{
				Field:   fieldPath(doc, append(e.InstanceLocation[:len(e.InstanceLocation):len(e.InstanceLocation)], p)),
				Rule:    "additionalProperties",
				Message: "unknown property",
			})
		}
		return
	case *kind.Type:
		// A fraction where a whole number is wanted: say so in those
		// words, as the event decoder does (events.DecodeJSON).
		if k.Got == "number" && len(k.Want) == 1 && k.Want[0] == "integer" {
			if n, ok := valueAt(doc, e.InstanceLocation).(json.Number); ok {
				*probs = append(*probs, Problem{
					Field:   fieldPath(doc, e.InstanceLocation),
					Rule:    "type",
					Message: fmt.Sprintf("must be a whole number, got %.40s", string(n)),
				})
				return
			}
		}
	case *kind.PropertyNames:
		// Its causes are about the name, not the value; report the name.
		// The validator's InstanceLocation for this kind shares its array
		// with later siblings' locations (it can read "job_id" for
		// "labels"), so the object is found in the document instead: the
		// one that holds the offending name.
		loc := keyLocation(doc, k.Property)
		if loc == nil {
			loc = e.InstanceLocation
		}
		*probs = append(*probs, Problem{
			Field:   fieldPath(doc, append(loc[:len(loc):len(loc)], k.Property)),
			Rule:    "propertyNames",
			Message: k.LocalizedString(printer),
		})
		return
	}
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collect(c, doc, probs)
		}
		return
	}
	r := rule(e.ErrorKind)
	*probs = append(*probs, Problem{
		Field: fieldPath(doc, e.InstanceLocation),
		Rule:  r,
		// Some messages repeat the keyword ("minimum: got 0, want 1"),
		// which the Rule already says.
		Message: strings.TrimPrefix(e.ErrorKind.LocalizedString(printer), r+": "),
	})
}

// rule names the keyword of an error kind; the few kinds that have none are
// named after what they are.
func rule(k jsonschema.ErrorKind) string {
	if kp := k.KeywordPath(); len(kp) > 0 {
		return kp[0]
	}
	switch k.(type) {
	case *kind.FalseSchema:
		return "false"
	case *kind.InvalidJsonValue:
		return "json"
	case *kind.Not:
		return "not"
	case *kind.RefCycle:
		return "$ref"
	}
	return "schema"
}

// simpleKey is a property name that reads unambiguously after a dot.
var simpleKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// fieldPath renders a JSON pointer's tokens as a dotted path, such as
// ranks[3].gpu. It walks doc to tell array indexes from object keys that
// happen to be digits.
func fieldPath(doc any, loc []string) string {
	field := ""
	cur := doc
	for _, tok := range loc {
		switch v := cur.(type) {
		case []any:
			field += "[" + tok + "]"
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(v) {
				cur = v[i]
			} else {
				cur = nil
			}
			continue
		case map[string]any:
			cur = v[tok]
		default:
			cur = nil
		}
		field = appendKey(field, tok)
	}
	return field
}

// keyLocation is the location of the first object in doc, depth first and
// in key order, that has a property named key; nil when none has.
func keyLocation(doc any, key string) []string {
	switch v := doc.(type) {
	case map[string]any:
		if _, ok := v[key]; ok {
			return []string{}
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if loc := keyLocation(v[k], key); loc != nil {
				return append([]string{k}, loc...)
			}
		}
	case []any:
		for i, x := range v {
			if loc := keyLocation(x, key); loc != nil {
				return append([]string{strconv.Itoa(i)}, loc...)
			}
		}
	}
	return nil
}

// valueAt is the value a JSON pointer's tokens lead to in doc, nil when
// there is none.
func valueAt(doc any, loc []string) any {
	cur := doc
	for _, tok := range loc {
		switch v := cur.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil
			}
			cur = v[i]
		case map[string]any:
			cur = v[tok]
		default:
			return nil
		}
	}
	return cur
}

// appendKey adds a property to a dotted path, quoting keys that hold dots or
// other punctuation, such as labels["app.kubernetes.io/name"].
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

// maxProblemText bounds a problem's field and message, in bytes: a
// property name or a value quoted in either may be megabytes long, and
// the problem travels in an answer and a dead letter's header.
const maxProblemText = 1024

// clipText shortens s to maxProblemText bytes, at a character's start.
func clipText(s string) string {
	if len(s) <= maxProblemText {
		return s
	}
	cut := maxProblemText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// newValidationError sorts the problems and drops duplicates, so that the
// error reads the same whatever order the validator visited the body in.
// Fields and messages are clipped (clipText).
func newValidationError(probs []Problem) *ValidationError {
	for i := range probs {
		probs[i].Field, probs[i].Message = clipText(probs[i].Field), clipText(probs[i].Message)
	}
	sort.Slice(probs, func(i, j int) bool {
		a, b := probs[i], probs[j]
		if a.Field != b.Field {
			return a.Field < b.Field
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Message < b.Message
	})
	out := probs[:0]
	for i, p := range probs {
		if i == 0 || p != probs[i-1] {
			out = append(out, p)
		}
	}
	return &ValidationError{Problems: out}
}
