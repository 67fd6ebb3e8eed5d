package schemas

// A fast path for bodies that pass, and a bounded answer for those that
// do not.
//
// Every event a service publishes or receives is validated, and nearly
// all of them pass. Through the library, a pass costs a document of maps
// and slices (decode) and a walk of the compiled schema that allocates
// per value checked: with the collector's work that follows, about a
// sixth of an all-in-one operator's CPU (toposched load --e2e with the
// checks skipped). compileFast translates each event's compiled schema
// (the library's *jsonschema.Schema, its references resolved) into a
// fastSchema, and check reads the body's bytes against it in one pass,
// JSON grammar included, with no document and next to no allocation: a
// placement.decided example in about 10 µs rather than 68.
//
// A body that fails costs the library about a kilobyte and a few
// microseconds per value (an args of 400,000 numbers: 436 MB and a
// second), so the library must never see a large one. check therefore
// also says where a body first fails and by which keyword, and stops
// reading there: at the first array past its maxItems, the first property
// that additionalProperties: false forbids, the first string past its
// maxLength, the first container nested deeper than MaxDepth. Its answer
// is one the library gives too (the same field and rule, among the
// library's problems): the reading problems first (not JSON, a repeated
// property, a number out of range, nesting past MaxDepth), as decode
// reports them, then the schema's, with the library's order of checks
// where the library stops at the first (type, const, enum and format
// before anything else of the same schema). Validate lets the library
// explain a body of at most maxLibraryValues values in full and answers
// a larger one with check's problem alone.
//
// check leaves undecided only what it cannot decide cheaply: uniqueItems
// over values other than numbers and strings, and references past
// maxFastDepth (a reference cycle that never reaches into the value). The
// library stays the authority on what it may explain: TestFastAgrees,
// TestFastAgreesOnKeywords and FuzzFastAgrees hold check's verdicts (a
// pass, a failure's field and rule) to the library's on generated bodies
// of every event and of a schema using every keyword, FuzzFastGrammar to
// Validate's reading of JSON. A schema using a keyword compileFast does
// not know gets no fast path at all (TestFastCoversEvents says which
// events have one); its bodies are still measured (depth, values) before
// the library reads them.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/bits"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// jsonKind is a bit per JSON type, as in a schema's "type".
type jsonKind uint8

const (
	kindNull jsonKind = 1 << iota
	kindBoolean
	kindNumber
	kindInteger
	kindString
	kindArray
	kindObject
)

var kindNames = map[string]jsonKind{"null": kindNull, "boolean": kindBoolean, "number": kindNumber,
	"integer": kindInteger, "string": kindString, "array": kindArray, "object": kindObject}

// maxFastProperties bounds the properties (and required names) of one
// schema object: they are tracked in a uint64 while its object is read.
const maxFastProperties = 64

// maxFastDepth bounds the references and anyOf branches followed on one
// value: past it (a reference cycle that never reaches into the value),
// the library decides.
const maxFastDepth = 64

// fastSchema is one schema object in the form check reads: every
// keyword it holds must hold of the value, as in JSON Schema.
type fastSchema struct {
	// lib is the schema it translates, for the words of a problem.
	lib *jsonschema.Schema

	never bool     // the false schema
	types jsonKind // "type"; 0 admits every kind

	// refs are schemas that must hold of the same value: $ref and allOf.
	refs  []*fastSchema
	anyOf []*fastSchema

	enum     []string // "enum" of strings only; nil when none
	hasEnum  bool
	constStr *string
	constNum *bound // "const" of a number: equal by value

	// numberKeyword's check: the value must be a number, integral if
	// asked, within its bounds.
	number *numberCheck
	bounds []bound // the library's own bounds, on numbers only

	minLen, maxLen int // in runes; -1: none
	pattern        *regexp.Regexp
	format         func(any) error
	// early: type, const, enum or format is set, which the library
	// checks before anything else of the schema and stops at.
	early bool
	// plainNumber: the number keyword is all the schema checks.
	plainNumber bool
	// lengthOnly: a string meets the schema if its length is within
	// minLength and maxLength.
	lengthOnly bool

	props         map[string]int // "properties" and "required" names, each its bit
	names         []string       // the names, by bit
	propSchemas   []*fastSchema  // by bit; nil for a name only required
	inProperties  uint64         // the bits of names under "properties"
	required      uint64
	additional    *fastSchema // additionalProperties as a schema
	noAdditional  bool        // additionalProperties: false
	propertyNames *fastSchema
	minProps      int // -1: none
	maxProps      int

	items    *fastSchema // nil admits every item
	minItems int         // -1: none
	maxItems int
	unique   bool

	// bare: nothing but refs and anyOf, which read the whole value, so
	// it need not be read again for keywords of its own.
	bare bool
}

// fastPrograms holds each event's fastSchema, nil for an event whose
// schema uses a keyword compileFast does not translate.
var fastPrograms = sync.OnceValues(func() (map[string]*fastSchema, error) {
	m, err := compiled()
	if err != nil {
		return nil, err
	}
	out := make(map[string]*fastSchema, len(m))
	for name, s := range m {
		out[name], _ = compileFast(s) // nil on error: the library alone (TestFastCoversEvents)
	}
	return out, nil
})

// compileFast translates a compiled schema, or says which keyword it
// cannot translate.
func compileFast(s *jsonschema.Schema) (*fastSchema, error) {
	c := fastCompiler{done: map[*jsonschema.Schema]*fastSchema{}}
	return c.schema(s)
}

type fastCompiler struct {
	done map[*jsonschema.Schema]*fastSchema
}

func (c *fastCompiler) schema(s *jsonschema.Schema) (*fastSchema, error) {
	if f, ok := c.done[s]; ok {
		return f, nil
	}
	f := &fastSchema{lib: s, minLen: -1, maxLen: -1, minProps: -1, maxProps: -1, minItems: -1, maxItems: -1}
	c.done[s] = f // before the parts: a schema may reach itself
	if s.Bool != nil {
		f.never = !*s.Bool
		return f, nil
	}
	if err := unsupported(s); err != nil {
		return nil, fmt.Errorf("%s: %w", s.Location, err)
	}
	many := func(ss []*jsonschema.Schema) ([]*fastSchema, error) {
		var out []*fastSchema
		for _, x := range ss {
			fx, err := c.schema(x)
			if err != nil {
				return nil, err
			}
			out = append(out, fx)
		}
		return out, nil
	}
	var err error
	if s.Ref != nil {
		if f.refs, err = many([]*jsonschema.Schema{s.Ref}); err != nil {
			return nil, err
		}
	}
	all, err := many(s.AllOf)
	if err != nil {
		return nil, err
	}
	f.refs = append(f.refs, all...)
	if f.anyOf, err = many(s.AnyOf); err != nil {
		return nil, err
	}
	if s.Types != nil {
		for _, t := range s.Types.ToStrings() {
			f.types |= kindNames[t]
		}
	}
	if s.Enum != nil {
		f.hasEnum = true
		for _, v := range s.Enum.Values {
			str, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s: enum of %T", s.Location, v)
			}
			f.enum = append(f.enum, str)
		}
	}
	if s.Const != nil {
		switch v := (*s.Const).(type) {
		case string:
			f.constStr = &v
		case json.Number:
			b, err := newBound("const", string(v))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.Location, err)
			}
			f.constNum = &b
		default:
			return nil, fmt.Errorf("%s: const of %T", s.Location, v)
		}
	}
	for _, b := range []struct {
		key string
		rat *big.Rat
	}{{"minimum", s.Minimum}, {"maximum", s.Maximum}, {"exclusiveMinimum", s.ExclusiveMinimum},
		{"exclusiveMaximum", s.ExclusiveMaximum}, {"multipleOf", s.MultipleOf}} {
		if b.rat != nil {
			f.bounds = append(f.bounds, ratBound(b.key, b.rat))
		}
	}
	for _, ext := range s.Extensions {
		switch e := ext.(type) {
		case *numberCheck:
			f.number = e
		case uniqueCheck:
			f.unique = true
		default:
			return nil, fmt.Errorf("%s: extension %T", s.Location, ext)
		}
	}
	if s.MinLength != nil {
		f.minLen = *s.MinLength
	}
	if s.MaxLength != nil {
		f.maxLen = *s.MaxLength
	}
	if s.Pattern != nil {
		re, ok := s.Pattern.(*regexp.Regexp)
		if !ok {
			return nil, fmt.Errorf("%s: pattern engine %T", s.Location, s.Pattern)
		}
		f.pattern = re
	}
	if s.Format != nil {
		f.format = s.Format.Validate
	}
	if err := c.object(s, f); err != nil {
		return nil, err
	}
	if s.Items2020 != nil {
		if f.items, err = c.schema(s.Items2020); err != nil {
			return nil, err
		}
	}
	if s.MinItems != nil {
		f.minItems = *s.MinItems
	}
	if s.MaxItems != nil {
		f.maxItems = *s.MaxItems
	}
	f.early = f.types != 0 || f.hasEnum || f.constStr != nil || f.constNum != nil || f.format != nil
	f.plainNumber = f.number != nil && !f.early && len(f.bounds) == 0 && len(f.refs) == 0 && len(f.anyOf) == 0
	f.lengthOnly = (f.types == 0 || f.types&kindString != 0) && !f.hasEnum && f.constStr == nil && f.constNum == nil &&
		f.format == nil && f.number == nil && f.pattern == nil
	f.bare = (len(f.refs) > 0 || len(f.anyOf) > 0) && f.types == 0 && !f.hasEnum && f.constStr == nil &&
		f.constNum == nil && f.number == nil && len(f.bounds) == 0 && f.minLen < 0 && f.maxLen < 0 &&
		f.pattern == nil && f.format == nil && f.props == nil && f.additional == nil && !f.noAdditional &&
		f.propertyNames == nil && f.minProps < 0 && f.maxProps < 0 && f.items == nil && f.minItems < 0 &&
		f.maxItems < 0 && !f.unique
	return f, nil
}

// object translates the object keywords.
func (c *fastCompiler) object(s *jsonschema.Schema, f *fastSchema) error {
	names := slices.Sorted(maps.Keys(s.Properties))
	for _, r := range s.Required {
		if _, ok := s.Properties[r]; !ok && !slices.Contains(names, r) {
			names = append(names, r)
		}
	}
	if len(names) > maxFastProperties {
		return fmt.Errorf("%s: %d properties", s.Location, len(names))
	}
	f.names = names
	if len(names) > 0 {
		f.props = make(map[string]int, len(names))
		f.propSchemas = make([]*fastSchema, len(names))
	}
	for i, n := range names {
		f.props[n] = i
		if ps, ok := s.Properties[n]; ok {
			f.inProperties |= 1 << i
			fs, err := c.schema(ps)
			if err != nil {
				return err
			}
			f.propSchemas[i] = fs
		}
	}
	for _, r := range s.Required {
		f.required |= 1 << f.props[r]
	}
	switch a := s.AdditionalProperties.(type) {
	case nil:
	case bool:
		f.noAdditional = !a
	case *jsonschema.Schema:
		fa, err := c.schema(a)
		if err != nil {
			return err
		}
		f.additional = fa
	default:
		return fmt.Errorf("%s: additionalProperties of %T", s.Location, a)
	}
	if s.PropertyNames != nil {
		fp, err := c.schema(s.PropertyNames)
		if err != nil {
			return err
		}
		f.propertyNames = fp
	}
	if s.MinProperties != nil {
		f.minProps = *s.MinProperties
	}
	if s.MaxProperties != nil {
		f.maxProps = *s.MaxProperties
	}
	return nil
}

// unsupported names a keyword of s that compileFast does not translate.
func unsupported(s *jsonschema.Schema) error {
	switch {
	case s.DraftVersion != 2020:
		return fmt.Errorf("draft %d", s.DraftVersion)
	case s.RecursiveRef != nil || s.DynamicRef != nil:
		return fmt.Errorf("dynamic reference")
	case s.Not != nil || len(s.OneOf) > 0 || s.If != nil || s.Then != nil || s.Else != nil:
		return fmt.Errorf("not, oneOf or if")
	case len(s.PatternProperties) > 0 || s.Dependencies != nil || s.DependentRequired != nil || s.DependentSchemas != nil:
		return fmt.Errorf("patternProperties or dependencies")
	case s.UnevaluatedProperties != nil || s.UnevaluatedItems != nil:
		return fmt.Errorf("unevaluated")
	case s.Contains != nil || s.MinContains != nil || s.MaxContains != nil:
		return fmt.Errorf("contains")
	case s.Items != nil || s.AdditionalItems != nil || len(s.PrefixItems) > 0:
		return fmt.Errorf("tuple items")
	case s.UniqueItems:
		return fmt.Errorf("uniqueItems outside the vocabulary")
	case s.ContentEncoding != nil || s.ContentMediaType != nil || s.ContentSchema != nil:
		return fmt.Errorf("content")
	}
	return nil
}

// result is check's verdict on one value.
type result uint8

const (
	// passes: the value meets the schema.
	passes result = iota
	// fails: it does not; walker.prob says where and by which keyword,
	// as the library would among its problems.
	fails
	// undecided: not decided here; the library decides.
	undecided
)

// MaxDepth is the most arrays and objects one body may nest: no event
// nests more than six (a jobs.analyzed's ranks), and a body that nests
// deeper is refused (rule "depth") before anything builds a document of
// it. It is events.MaxDepth.
const MaxDepth = 64

// walker reads one body for check. Its stacks are reused.
type walker struct {
	b       []byte
	i       int
	depth   int // refs and anyOf followed
	nesting int // arrays and objects open
	values  int // values read
	// scan: measure's reading, which records the first problem and
	// reads on, counting values.
	scan bool
	prob Problem
	// path is where the value being read sits.
	path []pathStep
	// keys holds the names of the objects being read that no bit
	// tracks, to find a repeated one; decoded holds the names that are
	// escaped or not ASCII, as encoding/json reads them, spans where
	// each is.
	keys    []keyRef
	decoded []byte
	spans   [][2]int32
	// items holds the spans of the items of the arrays being read with
	// uniqueItems; ints and strs are scratch for comparing them.
	items [][2]int
	ints  []intItem
	strs  []strItem
}

// pathStep is one property (index -1) or array element on the way to a
// value.
type pathStep struct {
	name  keyRef
	index int
}

// keyRef is a property name in four bytes (a body of 400,000 properties
// keeps one for each while it is read): where it is at least 0, the
// offset in the body of a plain name's first byte (it ends at the next
// quote); else -1 - the index of its span in walker.spans, of
// walker.decoded.
type keyRef int32

func bodyKey(start int) keyRef { return keyRef(start) }

// decodedKey adds the name decoded[start:end].
func (w *walker) decodedKey(start, end int) keyRef {
	w.spans = append(w.spans, [2]int32{int32(start), int32(end)})
	return keyRef(-len(w.spans))
}

func (k keyRef) decoded() bool { return k < 0 }

// name is the bytes of a property name.
func (w *walker) name(k keyRef) []byte {
	if k.decoded() {
		sp := w.spans[-k-1]
		return w.decoded[sp[0]:sp[1]]
	}
	return w.b[k : int(k)+bytes.IndexByte(w.b[k:], '"')]
}

var walkers = sync.Pool{New: func() any { return new(walker) }}

// maxPooledKeys bounds the names a pooled walker keeps room for: a body
// of 400,000 properties must not leave its stack behind.
const maxPooledKeys = 1 << 12

// check reads body against s (nil admits every value) and says whether it
// holds, where it first fails (the Problem), or that it cannot tell; and
// how many values it read.
//
// It checks the JSON grammar as it reads, rather than running json.Valid
// first, which took half of the time.
func (s *fastSchema) check(body []byte) (result, Problem, int) {
	return read(s, body, false)
}

// measure reads body with no schema: its first reading problem (not
// JSON, a repeated property, a number out of range, nesting past
// MaxDepth), as decode finds it, and how many values it holds (all of
// them even past a problem; math.MaxInt past MaxDepth, where it stops).
func measure(body []byte) (result, Problem, int) {
	return read(nil, body, true)
}

func read(s *fastSchema, body []byte, scan bool) (result, Problem, int) {
	w := walkers.Get().(*walker)
	w.b, w.i, w.depth, w.nesting, w.values, w.scan, w.prob = body, 0, 0, 0, 0, scan, Problem{}
	r := w.value(s)
	if r == passes {
		w.space()
		if w.i != len(w.b) {
			r = w.fail("json", "not JSON: data after the value")
		}
	}
	if w.scan && w.prob.Rule != "" && r == passes {
		r = fails // a problem recorded on the way
	}
	prob, values := w.prob, w.values
	keys, items, ints, strs := w.keys[:0], w.items[:0], w.ints[:0], w.strs[:0]
	decoded := w.decoded[:0]
	if cap(keys) > maxPooledKeys || cap(items) > maxPooledKeys || cap(decoded) > maxPooledKeys*64 {
		keys, items, ints, strs, decoded = nil, nil, nil, nil, nil
	}
	spans := w.spans[:0]
	if cap(spans) > maxPooledKeys {
		spans = nil
	}
	*w = walker{path: w.path[:0], keys: keys, decoded: decoded, spans: spans, items: items, ints: ints, strs: strs}
	walkers.Put(w)
	return r, prob, values
}

// field spells out w.path, such as ranks[3].gpu; "" is the whole body.
func (w *walker) field() string {
	f := ""
	for _, s := range w.path {
		if s.index >= 0 {
			f += "[" + strconv.Itoa(s.index) + "]"
		} else {
			f = appendKey(f, string(w.name(s.name)))
		}
	}
	return f
}

// fail records why the value at w.path fails, unless a problem is
// recorded already (a scan reads on past the first), and says fails.
func (w *walker) fail(rule, msg string) result {
	if !w.scan || w.prob.Rule == "" {
		w.prob = Problem{Field: w.field(), Rule: rule, Message: msg}
	}
	return fails
}

// failKind is fail in the library's words for k.
func (w *walker) failKind(rule string, k jsonschema.ErrorKind) result {
	return w.fail(rule, strings.TrimPrefix(k.LocalizedString(printer), rule+": "))
}

// failName is fail for the property name k of the object at w.path, where
// the library puts missing, unknown and badly named properties.
func (w *walker) failName(k keyRef, rule, msg string) result {
	w.path = append(w.path, pathStep{name: k, index: -1})
	r := w.fail(rule, msg)
	w.path = w.path[:len(w.path)-1]
	return r
}

// next reports whether the byte at w.i is c, and moves past it if so.
func (w *walker) next(c byte) bool {
	if w.i < len(w.b) && w.b[w.i] == c {
		w.i++
		return true
	}
	return false
}

// literal moves past lit at w.i, or reports false.
func (w *walker) literal(lit string) bool {
	if len(w.b)-w.i < len(lit) || string(w.b[w.i:w.i+len(lit)]) != lit {
		return false
	}
	w.i += len(lit)
	return true
}

func (w *walker) space() { w.i = skipSpace(w.b, w.i) }

// notJSON is a grammar failure: decode's words replace these (Validate
// asks json.Valid first).
func (w *walker) notJSON() result { return w.fail("json", "not JSON") }

// value checks the value at w.i against s (nil admits anything) and moves
// past it (when it holds).
func (w *walker) value(s *fastSchema) result {
	w.space()
	if w.i >= len(w.b) {
		return w.notJSON()
	}
	if s == nil {
		return w.own(nil)
	}
	if s.never {
		return w.failKind("false", &kind.FalseSchema{})
	}
	if len(s.refs) == 0 && len(s.anyOf) == 0 {
		return w.own(s)
	}
	if w.depth++; w.depth > maxFastDepth {
		w.depth--
		return undecided
	}
	defer func() { w.depth-- }()
	start := w.i
	// The library checks type, const, enum and format first, and stops
	// at them: a $ref's problems would not be among its own then.
	if s.early {
		if r := w.peek(s); r != passes {
			return r
		}
	}
	for _, r := range s.refs {
		w.i = start
		if res := w.value(r); res != passes {
			return res
		}
	}
	if len(s.anyOf) > 0 {
		var first Problem
		failed, unsure, matched := false, false, false
		for _, a := range s.anyOf {
			w.i = start
			switch w.value(a) {
			case passes:
				matched = true
			case fails:
				if !failed {
					first, failed = w.prob, true
				}
			default:
				unsure = true
			}
			if matched {
				break
			}
		}
		if !matched {
			if unsure {
				return undecided
			}
			// The library lists every branch's problems; the first
			// branch's first is one of them.
			w.prob = first
			return fails
		}
	}
	if s.bare {
		return passes // w.i is past the value, where the last walk left it
	}
	w.i = start
	return w.own(s)
}

// peek checks s's early keywords (type, const, enum, format) on the value
// at w.i, leaving w.i where it was.
func (w *walker) peek(s *fastSchema) result {
	start := w.i
	defer func() { w.i = start }()
	switch c := w.b[w.i]; c {
	case '{':
		return w.kindEarly(s, kindObject)
	case '[':
		return w.kindEarly(s, kindArray)
	case '"':
		ks, ke, plain, ok := w.str()
		if !ok {
			return w.notJSON()
		}
		if rule, k := s.stringEarly(w.b[ks:ke], !plain, plain); rule != "" {
			return w.failKind(rule, k)
		}
		return passes
	case 't', 'f', 'n':
		return w.kindEarly(s, literalKind(c))
	}
	var n number
	if r := w.readNumber(&n); r != passes {
		return r
	}
	return w.numberEarly(s, &n)
}

func literalKind(c byte) jsonKind {
	if c == 'n' {
		return kindNull
	}
	return kindBoolean
}

// kindWords are the JSON types in the library's words, in its order.
var kindWords = []struct {
	k    jsonKind
	name string
}{{kindNull, "null"}, {kindBoolean, "boolean"}, {kindNumber, "number"}, {kindInteger, "integer"},
	{kindString, "string"}, {kindArray, "array"}, {kindObject, "object"}}

func (k jsonKind) String() string {
	for _, kw := range kindWords {
		if kw.k == k {
			return kw.name
		}
	}
	return "number"
}

// want is s's "type" in the library's words.
func (s *fastSchema) want() []string {
	if s.lib != nil && s.lib.Types != nil {
		return s.lib.Types.ToStrings()
	}
	var out []string
	for _, kw := range kindWords {
		if s.types&kw.k != 0 {
			out = append(out, kw.name)
		}
	}
	return out
}

// kindEarly checks the early keywords on a value of kind k other than a
// string or a number: its type, and const or enum, which no such value
// meets.
func (w *walker) kindEarly(s *fastSchema, k jsonKind) result {
	switch {
	case s.types != 0 && s.types&k == 0:
		return w.failKind("type", &kind.Type{Got: k.String(), Want: s.want()})
	case s.constStr != nil || s.constNum != nil:
		return w.failKind("const", &kind.Const{Got: k.String(), Want: *s.lib.Const})
	case s.hasEnum:
		return w.failKind("enum", &kind.Enum{Got: k.String(), Want: s.lib.Enum.Values})
	case s.number != nil:
		// The number keyword's own type check (its schema has no other
		// keyword).
		return w.failKind("type", &kind.Type{Got: k.String(), Want: s.number.want})
	}
	return passes
}

// own checks the value at w.i against s's own keywords (its refs and
// anyOf are value's) and moves past it.
func (w *walker) own(s *fastSchema) result {
	w.values++
	switch c := w.b[w.i]; c {
	case '{':
		return w.object(s)
	case '[':
		return w.array(s)
	case '"':
		ks, ke, plain, ok := w.str()
		if !ok {
			return w.notJSON()
		}
		if s == nil {
			return passes
		}
		if plain && s.lengthOnly {
			// Most strings of an event: a type and a length to check.
			if n := ke - ks; (s.minLen < 0 || n >= s.minLen) && (s.maxLen < 0 || n <= s.maxLen) {
				return passes
			}
		}
		if rule, k := s.stringOwn(w.b[ks:ke], !plain, plain); rule != "" {
			return w.failKind(rule, k)
		}
		return passes
	case 't', 'f', 'n':
		lit := "null"
		switch c {
		case 't':
			lit = "true"
		case 'f':
			lit = "false"
		}
		if !w.literal(lit) {
			return w.notJSON()
		}
		if s == nil {
			return passes
		}
		return w.kindEarly(s, literalKind(c))
	}
	var n number
	if r := w.readNumber(&n); r != passes || s == nil {
		return r
	}
	if s.plainNumber {
		// The number keyword alone, as most numbers of an event are
		// checked: its verdict, worded by numberLate where it fails.
		if s.number.holds(&n) {
			return passes
		}
		return w.numberLate(s, &n)
	}
	if r := w.numberEarly(s, &n); r != passes {
		return r
	}
	return w.numberLate(s, &n)
}

// str moves past the string at w.i and returns its contents' span, and
// whether they are plain (ASCII, no escapes: the bytes are the string);
// ok is false where it is not a JSON string.
func (w *walker) str() (start, end int, plain, ok bool) {
	if !w.next('"') {
		return 0, 0, false, false
	}
	start, plain = w.i, true
	for ; w.i < len(w.b); w.i++ {
		switch c := w.b[w.i]; {
		case c == '"':
			end = w.i
			w.i++
			return start, end, plain, true
		case c < 0x20:
			return 0, 0, false, false
		case c >= utf8.RuneSelf:
			plain = false
		case c == '\\':
			plain = false
			if w.i++; w.i >= len(w.b) {
				return 0, 0, false, false
			}
			switch w.b[w.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(w.b)-w.i <= 4 {
					return 0, 0, false, false
				}
				for _, h := range w.b[w.i+1 : w.i+5] {
					if !isHex(h) {
						return 0, 0, false, false
					}
				}
				w.i += 4
			default:
				return 0, 0, false, false
			}
		}
	}
	return 0, 0, false, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// numberEnd is where the JSON number at i ends, -1 where none starts
// there: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func numberEnd(b []byte, i int) int {
	digits := func() bool {
		start := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return -1
		}
	}
	return i
}

// stringEarly checks a string, given as its contents' bytes (escaped:
// as written in JSON, escapes and all; ascii: one byte a character),
// against s's early keywords; it returns the rule that fails and the
// library's kind of error, or "".
func (s *fastSchema) stringEarly(raw []byte, escaped, ascii bool) (string, jsonschema.ErrorKind) {
	if s.types != 0 && s.types&kindString == 0 {
		return "type", &kind.Type{Got: "string", Want: s.want()}
	}
	if s.constNum != nil {
		return "const", &kind.Const{Got: text(raw, escaped), Want: *s.lib.Const}
	}
	if s.constStr == nil && !s.hasEnum && s.format == nil {
		return "", nil
	}
	if escaped {
		raw = unquote(raw)
	}
	if s.constStr != nil && string(raw) != *s.constStr {
		return "const", &kind.Const{Got: string(raw), Want: *s.constStr}
	}
	if s.hasEnum && !slices.ContainsFunc(s.enum, func(e string) bool { return string(raw) == e }) {
		return "enum", &kind.Enum{Got: string(raw), Want: s.lib.Enum.Values}
	}
	if s.format != nil {
		if err := s.format(string(raw)); err != nil {
			return "format", &kind.Format{Got: string(raw), Want: s.lib.Format.Name, Err: err}
		}
	}
	return "", nil
}

// stringOwn checks a string against all of s's own keywords, in the
// library's order.
func (s *fastSchema) stringOwn(raw []byte, escaped, ascii bool) (string, jsonschema.ErrorKind) {
	if rule, k := s.stringEarly(raw, escaped, ascii); rule != "" {
		return rule, k
	}
	if s.number != nil {
		return "type", &kind.Type{Got: "string", Want: s.number.want}
	}
	if s.minLen < 0 && s.maxLen < 0 && s.pattern == nil {
		return "", nil
	}
	if escaped {
		raw = unquote(raw)
	}
	if s.minLen >= 0 || s.maxLen >= 0 {
		n := len(raw)
		if !ascii {
			n = utf8.RuneCount(raw)
		}
		if s.minLen >= 0 && n < s.minLen {
			return "minLength", &kind.MinLength{Got: n, Want: s.minLen}
		}
		if s.maxLen >= 0 && n > s.maxLen {
			return "maxLength", &kind.MaxLength{Got: n, Want: s.maxLen}
		}
	}
	if s.pattern != nil && !s.pattern.Match(raw) {
		return "pattern", &kind.Pattern{Got: clipText(string(raw)), Want: s.pattern.String()}
	}
	return "", nil
}

// text is a string's value for a message.
func text(raw []byte, escaped bool) string {
	if escaped {
		raw = unquote(raw)
	}
	return clipText(string(raw))
}

// nameHolds checks a property name, as stringOwn takes a string, against
// s, its refs and anyOf included (value does not read names).
func (s *fastSchema) nameHolds(raw []byte, escaped, ascii bool, depth int) result {
	if s.never {
		return fails
	}
	if depth > maxFastDepth {
		return undecided
	}
	for _, r := range s.refs {
		if res := r.nameHolds(raw, escaped, ascii, depth+1); res != passes {
			return res
		}
	}
	if len(s.anyOf) > 0 {
		res := fails
		for _, a := range s.anyOf {
			switch a.nameHolds(raw, escaped, ascii, depth+1) {
			case passes:
				res = passes
			case undecided:
				if res == fails {
					res = undecided
				}
			}
			if res == passes {
				break
			}
		}
		if res != passes {
			return res
		}
	}
	if rule, _ := s.stringOwn(raw, escaped, ascii); rule != "" {
		return fails
	}
	return passes
}

// unquote decodes a string's contents as encoding/json does, for those
// whose bytes are not the string (escapes, non-ASCII).
func unquote(raw []byte) []byte {
	var str string
	_ = json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &str) // str checked its grammar
	return []byte(str)
}

// readNumber reads the number at w.i, in the range Validate's reading
// takes.
func (w *walker) readNumber(n *number) result {
	start := w.i
	if w.i = numberEnd(w.b, start); w.i < 0 {
		w.i = start
		return w.notJSON()
	}
	lit := w.b[start:w.i]
	var short bool
	if *n, short = smallInt(lit); short {
		return passes
	}
	if !numberInRange(string(lit)) {
		if w.scan {
			if w.prob.Rule == "" { // a scan words only its first problem
				w.fail("number", fmt.Sprintf("number %.40s out of range", lit))
			}
			return passes // and reads on
		}
		return w.fail("number", fmt.Sprintf("number %.40s out of range", lit))
	}
	*n = parseNumber(string(lit))
	return passes
}

// numberEarly checks a number against s's early keywords.
func (w *walker) numberEarly(s *fastSchema, n *number) result {
	if s.types != 0 && s.types&kindNumber == 0 {
		if s.types&kindInteger == 0 {
			return w.failKind("type", &kind.Type{Got: "number", Want: s.want()})
		}
		if !n.integral() {
			return w.fail("type", "must be a whole number, got "+clipNumber(n))
		}
	}
	if s.constStr != nil {
		return w.failKind("const", &kind.Const{Got: n.exact(), Want: *s.constStr})
	}
	if s.constNum != nil && cmpNumber(n, *s.constNum) != 0 {
		return w.failKind("const", &kind.Const{Got: n.exact(), Want: s.constNum.rat})
	}
	if s.hasEnum {
		return w.failKind("enum", &kind.Enum{Got: n.exact(), Want: s.lib.Enum.Values})
	}
	return passes
}

// numberLate checks a number against the number keyword and the
// library's bounds.
func (w *walker) numberLate(s *fastSchema, n *number) result {
	if c := s.number; c != nil {
		if c.integer && !n.integral() {
			return w.fail("type", "must be a whole number, got "+clipNumber(n))
		}
		for _, b := range c.bounds {
			if !holds(n, b) {
				return w.failBound(b, n)
			}
		}
	}
	for _, b := range s.bounds {
		if !holds(n, b) {
			return w.failBound(b, n)
		}
	}
	return passes
}

// failBound is fail for a number past bound b, in the library's words.
func (w *walker) failBound(b bound, n *number) result {
	var k jsonschema.ErrorKind
	switch b.key {
	case "minimum":
		k = &kind.Minimum{Got: n.exact(), Want: b.rat}
	case "maximum":
		k = &kind.Maximum{Got: n.exact(), Want: b.rat}
	case "exclusiveMinimum":
		k = &kind.ExclusiveMinimum{Got: n.exact(), Want: b.rat}
	case "exclusiveMaximum":
		k = &kind.ExclusiveMaximum{Got: n.exact(), Want: b.rat}
	default:
		k = &kind.MultipleOf{Got: n.exact(), Want: b.rat}
	}
	return w.failKind(b.key, k)
}

// clipNumber is a number's literal for a message, as collect words it.
func clipNumber(n *number) string {
	lit := n.lit
	if lit == "" {
		lit = strconv.FormatInt(n.i, 10)
	}
	return fmt.Sprintf("%.40s", lit)
}

// smallInt reads a plain integer literal of up to 18 digits, which no
// range check can refuse and an int64 holds, without allocating.
func smallInt(lit []byte) (number, bool) {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return number{}, false
	}
	var i int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return number{}, false
		}
		i = i*10 + int64(c-'0')
	}
	if len(digits) < len(lit) {
		i = -i
	}
	return number{i: i, isInt: true, f: float64(i), isF: true}, true
}

// smallNames is how many names of one object no bit tracks are compared
// one by one for a repeat; past it they are sorted once the object is
// read, so that 400,000 properties cost n log n, not n².
const smallNames = 16

func (w *walker) object(s *fastSchema) result {
	if s != nil && (s.early || s.number != nil) {
		if r := w.kindEarly(s, kindObject); r != passes {
			return r
		}
	}
	if w.nesting+1 > MaxDepth {
		return w.tooDeep()
	}
	w.nesting++
	w.i++ // {
	base, pbase := len(w.keys), len(w.path)
	var seen uint64
	n := 0
	r := w.members(func(k keyRef, key []byte) result {
		n++
		if s != nil && s.maxProps >= 0 && n > s.maxProps {
			return w.fail("maxProperties", printer.Sprintf("got more than %d, want %d", s.maxProps, s.maxProps))
		}
		bit, tracked := -1, false
		if s != nil {
			bit, tracked = s.props[string(key)]
		}
		if tracked {
			if seen&(1<<bit) != 0 {
				if r := w.failName(k, "json", "duplicate property"); !w.scan {
					return r
				}
			}
			seen |= 1 << bit
		} else {
			if len(w.keys)-base < smallNames {
				for _, o := range w.keys[base:] {
					if string(w.name(o)) == string(key) {
						if r := w.failName(k, "json", "duplicate property"); !w.scan {
							return r
						}
						break
					}
				}
			}
			if len(w.keys) == cap(w.keys) {
				w.keys = slices.Grow(w.keys, len(w.keys)) // double: append grows a large slice by a quarter
			}
			w.keys = append(w.keys, k)
		}
		var sub *fastSchema
		if s != nil {
			switch {
			case tracked && s.inProperties&(1<<bit) != 0:
				sub = s.propSchemas[bit]
			case s.noAdditional:
				return w.failName(k, "additionalProperties", "unknown property")
			default:
				sub = s.additional
			}
			if s.propertyNames != nil {
				switch s.propertyNames.nameHolds(key, false, !k.decoded(), w.depth) {
				case fails:
					return w.failName(k, "propertyNames", (&kind.PropertyNames{Property: clipText(string(key))}).LocalizedString(printer))
				case undecided:
					return undecided
				}
			}
		}
		w.path = append(w.path, pathStep{name: k, index: -1})
		r := w.value(sub)
		w.path = w.path[:len(w.path)-1]
		return r
	})
	if r == passes && len(w.keys)-base > smallNames {
		if k, dup := w.repeated(w.keys[base:]); dup {
			r = w.failName(k, "json", "duplicate property")
			if w.scan {
				r = passes
			}
		}
	}
	w.keys, w.path = w.keys[:base], w.path[:pbase]
	w.nesting--
	if r != passes || s == nil {
		return r
	}
	if missing := s.required &^ seen; missing != 0 {
		name := s.names[bits.TrailingZeros64(missing)]
		start := len(w.decoded)
		w.decoded = append(w.decoded, name...)
		return w.failName(w.decodedKey(start, len(w.decoded)), "required", "missing property")
	}
	if s.minProps >= 0 && n < s.minProps {
		return w.failKind("minProperties", &kind.MinProperties{Got: n, Want: s.minProps})
	}
	return passes
}

// tooDeep refuses a container that would nest past MaxDepth. A scan
// stops there: what lies below is not read.
func (w *walker) tooDeep() result {
	w.fail("depth", fmt.Sprintf("nested deeper than %d arrays and objects", MaxDepth))
	if w.scan {
		w.values = math.MaxInt
	}
	return fails
}

// repeated finds a name given twice among keys, by sorting them.
func (w *walker) repeated(keys []keyRef) (keyRef, bool) {
	slices.SortFunc(keys, func(a, b keyRef) int { return bytes.Compare(w.name(a), w.name(b)) })
	for i := 1; i < len(keys); i++ {
		if bytes.Equal(w.name(keys[i]), w.name(keys[i-1])) {
			return keys[i], true
		}
	}
	return 0, false
}

// members reads an object's members after its '{', through its '}',
// calling member with each name, and its bytes, once w.i is at its value.
// A name that is escaped or not ASCII is decoded into w.decoded, as
// encoding/json reads it.
func (w *walker) members(member func(k keyRef, key []byte) result) result {
	w.space()
	if w.next('}') {
		return passes
	}
	for {
		w.space()
		ks, ke, plain, ok := w.str()
		if !ok {
			return w.notJSON()
		}
		k, key := bodyKey(ks), w.b[ks:ke]
		if !plain {
			start := len(w.decoded)
			w.decoded = append(w.decoded, unquote(key)...)
			k, key = w.decodedKey(start, len(w.decoded)), w.decoded[start:]
		}
		w.space()
		if !w.next(':') {
			return w.notJSON()
		}
		if r := member(k, key); r != passes {
			return r
		}
		w.space()
		if w.next('}') {
			return passes
		}
		if !w.next(',') {
			return w.notJSON()
		}
	}
}

func (w *walker) array(s *fastSchema) result {
	if s != nil && (s.early || s.number != nil) {
		if r := w.kindEarly(s, kindArray); r != passes {
			return r
		}
	}
	if w.nesting+1 > MaxDepth {
		return w.tooDeep()
	}
	w.nesting++
	w.i++ // [
	var items *fastSchema
	unique, maxItems := false, -1
	if s != nil {
		items, unique, maxItems = s.items, s.unique, s.maxItems
	}
	base, pbase := len(w.items), len(w.path)
	w.path = append(w.path, pathStep{index: 0})
	n := 0
	r := w.elements(func() result {
		if maxItems >= 0 && n >= maxItems {
			// Stop at the first item too many: the rest is not read.
			w.path = w.path[:pbase]
			return w.fail("maxItems", printer.Sprintf("got more than %d, want %d", maxItems, maxItems))
		}
		w.path[pbase].index = n
		start := w.i
		if r := w.value(items); r != passes {
			return r
		}
		if unique {
			w.items = append(w.items, [2]int{start, w.i})
		}
		n++
		return passes
	})
	w.path = w.path[:pbase]
	if r == passes && s != nil {
		switch {
		case s.minItems >= 0 && n < s.minItems:
			r = w.failKind("minItems", &kind.MinItems{Got: n, Want: s.minItems})
		case unique:
			if i, j, res := w.distinct(w.items[base:]); res == fails {
				r = w.failKind("uniqueItems", &kind.UniqueItems{Duplicates: [2]int{i, j}})
			} else {
				r = res
			}
		}
	}
	w.items = w.items[:base]
	w.nesting--
	return r
}

// elements reads an array's elements after its '[', through its ']',
// calling element with w.i at each.
func (w *walker) elements(element func() result) result {
	w.space()
	if w.next(']') {
		return passes
	}
	for {
		w.space()
		if r := element(); r != passes {
			return r
		}
		w.space()
		if w.next(']') {
			return passes
		}
		if !w.next(',') {
			return w.notJSON()
		}
	}
}

// intItem and strItem are an array item as distinct compares it, with
// its index.
type intItem struct {
	v int64
	i int
}

type strItem struct {
	number bool // v is a number's key (appendItemKey), not a string's bytes
	v      []byte
	i      int
}

// distinct says whether the items, given as spans, are all different, as
// the library finds them (the uniqueness vocabulary of unique.go) when
// each is a number (compared by value: 1, 1.0 and 1e0 are one) or a
// string; undecided otherwise. On a repeat it gives the pair the library
// names: the first item equal to an earlier one, and the first such
// earlier one.
func (w *walker) distinct(items [][2]int) (int, int, result) {
	if len(items) < 2 {
		return 0, 0, passes
	}
	first, second := -1, -1
	repeat := func(i, j int) {
		if second < 0 || j < second || (j == second && i < first) {
			first, second = i, j
		}
	}
	// Plain integers, the common case (a node's GPU indexes), without
	// allocating.
	ints := w.ints[:0]
	for idx, it := range items {
		n, ok := smallInt(w.b[it[0]:it[1]])
		if !ok {
			ints = nil
			break
		}
		ints = append(ints, intItem{n.i, idx})
	}
	if ints != nil {
		w.ints = ints
		if len(ints) <= smallNames {
			// Few: compare each with those before it, which finds the
			// pair the library names first.
			for j := 1; j < len(ints); j++ {
				for i := range j {
					if ints[i].v == ints[j].v {
						return i, j, fails
					}
				}
			}
			return 0, 0, passes
		}
		slices.SortStableFunc(ints, func(a, b intItem) int { return cmpInt(a.v, b.v) })
		for i := 1; i < len(ints); i++ {
			if ints[i].v == ints[i-1].v {
				repeat(ints[i-1].i, ints[i].i)
			}
		}
	} else {
		strs := w.strs[:0]
		for idx, it := range items {
			v := w.b[it[0]:it[1]]
			switch {
			case v[0] == '"':
				raw := v[1 : len(v)-1]
				if bytes.ContainsFunc(raw, func(r rune) bool { return r == '\\' || r >= utf8.RuneSelf }) {
					raw = unquote(raw)
				}
				strs = append(strs, strItem{v: raw, i: idx})
			case v[0] == '-' || ('0' <= v[0] && v[0] <= '9'):
				key, ok := appendItemKey(nil, json.Number(v))
				if !ok {
					return 0, 0, undecided // equal to nothing, as the library finds it
				}
				strs = append(strs, strItem{number: true, v: key, i: idx})
			default:
				return 0, 0, undecided // the library compares the rest
			}
		}
		w.strs = strs
		if len(strs) <= smallNames {
			for j := 1; j < len(strs); j++ {
				for i := range j {
					if strs[i].number == strs[j].number && bytes.Equal(strs[i].v, strs[j].v) {
						return i, j, fails
					}
				}
			}
			return 0, 0, passes
		}
		slices.SortStableFunc(strs, func(a, b strItem) int {
			if a.number != b.number {
				if a.number {
					return -1
				}
				return 1
			}
			return bytes.Compare(a.v, b.v)
		})
		for i := 1; i < len(strs); i++ {
			if strs[i].number == strs[i-1].number && bytes.Equal(strs[i].v, strs[i-1].v) {
				repeat(strs[i-1].i, strs[i].i)
			}
		}
	}
	if second < 0 {
		return 0, 0, passes
	}
	return first, second, fails
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
