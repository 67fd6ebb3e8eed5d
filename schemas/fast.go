package schemas

// A fast path for bodies that pass.
//
// Every event a service publishes or receives is validated, and nearly
// all of them pass. Through the library, a pass costs a document of maps
// and slices (decode) and a walk of the compiled schema that allocates
// per value checked: with the collector's work that follows, about a
// sixth of an all-in-one operator's CPU (toposched load --e2e with the
// checks skipped). compileFast translates each event's compiled schema
// (the library's *jsonschema.Schema, its references resolved) into a
// fastSchema, and accepts reads the body's bytes against it in one pass,
// JSON grammar included, with no document and next to no allocation: a
// placement.decided example in about 10 µs rather than 68.
//
// accepts only ever says "this body passes": on anything it cannot decide
// cheaply (an escaped or non-ASCII property name, uniqueItems over values
// other than plain integers and strings, nesting past maxFastNesting,
// references past maxFastDepth), and on every body that fails, Validate
// goes on to the library, which decides and explains. So the library
// stays the authority, the problems a failing body gets are the
// library's, and the fast path can only be wrong by accepting what the
// library refuses: TestFastAgrees and FuzzFastAgrees hold it to the
// library's verdict on generated bodies of every event, FuzzFastGrammar
// to Validate's reading of JSON. A schema using a keyword compileFast
// does not know gets no fast path at all (TestFastCoversEvents says
// which events have one).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"regexp"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
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

// fastSchema is one schema object in the form accepts reads: every
// keyword it holds must hold of the value, as in JSON Schema.
type fastSchema struct {
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

	props         map[string]int // "properties" and "required" names, each its bit
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
	f := &fastSchema{minLen: -1, maxLen: -1, minProps: -1, maxProps: -1, minItems: -1, maxItems: -1}
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

// walker reads one body for accepts. Its stacks are reused.
type walker struct {
	b       []byte
	i       int
	depth   int // refs and anyOf followed
	nesting int // arrays and objects open
	// keys holds the spans of the names of the objects being read that
	// no bit tracks, to find a repeated one.
	keys [][2]int
	// items holds the spans of the items of the arrays being read with
	// uniqueItems; ints is scratch for comparing them.
	items [][2]int
	ints  []int64
	strs  [][2]int
}

var walkers = sync.Pool{New: func() any { return new(walker) }}

// accepts reports whether body is JSON (as json.Valid has it) that
// Validate's reading takes (no repeated property, no number out of range)
// and that s holds of. false means "not shown here", not "invalid": the
// caller asks the library.
//
// It checks the JSON grammar as it reads, rather than running json.Valid
// first, which took half of the time: where the grammar is broken it
// says false, like anything else it does not show.
func (s *fastSchema) accepts(body []byte) bool {
	w := walkers.Get().(*walker)
	w.b, w.i, w.depth, w.nesting = body, 0, 0, 0
	ok := w.value(s)
	if ok {
		w.space()
		ok = w.i == len(w.b)
	}
	*w = walker{keys: w.keys[:0], items: w.items[:0], ints: w.ints[:0], strs: w.strs[:0]}
	walkers.Put(w)
	return ok
}

// maxFastNesting bounds the arrays and objects open at once: json.Valid
// refuses past 10,000, the fast path leaves anything past this to it.
const maxFastNesting = 1000

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

// value checks the value at w.i against s (nil admits anything) and moves
// past it.
func (w *walker) value(s *fastSchema) bool {
	w.space()
	if w.i >= len(w.b) {
		return false
	}
	if s == nil {
		return w.own(nil)
	}
	if s.never {
		return false
	}
	if len(s.refs) == 0 && len(s.anyOf) == 0 {
		return w.own(s)
	}
	if w.depth++; w.depth > maxFastDepth {
		return false
	}
	defer func() { w.depth-- }()
	start := w.i
	for _, r := range s.refs {
		w.i = start
		if !w.value(r) {
			return false
		}
	}
	if len(s.anyOf) > 0 {
		matched := false
		for _, a := range s.anyOf {
			w.i = start
			if w.value(a) {
				matched = true
				break
			}
		}
		if !matched {
			return false
		}
	}
	if s.bare {
		return true // w.i is past the value, where the last walk left it
	}
	w.i = start
	return w.own(s)
}

// admits reports whether s's kind-wide keywords (type, enum, const and the
// number keyword) let a value of kind k through; a number's integrality
// is the caller's.
func (s *fastSchema) admits(k jsonKind) bool {
	if s.types != 0 && s.types&k == 0 && (k != kindNumber || s.types&kindInteger == 0) {
		return false
	}
	if k != kindString && (s.hasEnum || s.constStr != nil) {
		return false
	}
	if k != kindNumber && (s.number != nil || s.constNum != nil) {
		return false
	}
	return true
}

// own checks the value at w.i against s's own keywords (its refs and
// anyOf are value's) and moves past it.
func (w *walker) own(s *fastSchema) bool {
	switch c := w.b[w.i]; c {
	case '{':
		return w.object(s)
	case '[':
		return w.array(s)
	case '"':
		start, end, plain, ok := w.str()
		return ok && (s == nil || s.stringHolds(w.b[start:end], plain, w.depth))
	case 't', 'f', 'n':
		lit, k := "null", kindNull
		switch c {
		case 't':
			lit, k = "true", kindBoolean
		case 'f':
			lit, k = "false", kindBoolean
		}
		return w.literal(lit) && (s == nil || s.admits(k))
	}
	return w.number(s)
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

// stringHolds checks a string, given as its contents' bytes, against s,
// its refs and anyOf included (for property names, which value does not
// read).
func (s *fastSchema) stringHolds(raw []byte, plain bool, depth int) bool {
	if s.never || depth > maxFastDepth {
		return false
	}
	for _, r := range s.refs {
		if !r.stringHolds(raw, plain, depth+1) {
			return false
		}
	}
	if len(s.anyOf) > 0 && !slices.ContainsFunc(s.anyOf, func(a *fastSchema) bool { return a.stringHolds(raw, plain, depth+1) }) {
		return false
	}
	if !s.admits(kindString) {
		return false
	}
	if !s.hasEnum && s.constStr == nil && s.minLen < 0 && s.maxLen < 0 && s.pattern == nil && s.format == nil {
		return true
	}
	if !plain {
		raw = unquote(raw)
	}
	if s.hasEnum && !slices.ContainsFunc(s.enum, func(e string) bool { return string(raw) == e }) {
		return false
	}
	if s.constStr != nil && string(raw) != *s.constStr {
		return false
	}
	if s.minLen >= 0 || s.maxLen >= 0 {
		n := len(raw)
		if !plain {
			n = utf8.RuneCount(raw)
		}
		if (s.minLen >= 0 && n < s.minLen) || (s.maxLen >= 0 && n > s.maxLen) {
			return false
		}
	}
	if s.pattern != nil && !s.pattern.Match(raw) {
		return false
	}
	if s.format != nil && s.format(string(raw)) != nil {
		return false
	}
	return true
}

// unquote decodes a string's contents as encoding/json does, for those
// whose bytes are not the string (escapes, non-ASCII).
func unquote(raw []byte) []byte {
	var str string
	_ = json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &str) // str checked its grammar
	return []byte(str)
}

// number checks the number at w.i: in the range Validate's reading takes,
// then against s.
func (w *walker) number(s *fastSchema) bool {
	start := w.i
	if w.i = numberEnd(w.b, start); w.i < 0 {
		return false
	}
	lit := w.b[start:w.i]
	n, short := smallInt(lit)
	if !short && !numberInRange(string(lit)) {
		return false
	}
	if s == nil {
		return true
	}
	if !s.admits(kindNumber) {
		return false
	}
	if !short {
		n = parseNumber(string(lit))
	}
	if s.types != 0 && s.types&kindNumber == 0 && !n.integral() {
		return false // integer only
	}
	if s.number != nil && !s.number.holds(&n) {
		return false
	}
	for _, b := range s.bounds {
		if !holds(&n, b) {
			return false
		}
	}
	if s.constNum != nil && cmpNumber(&n, *s.constNum) != 0 {
		return false
	}
	return true
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

func (w *walker) object(s *fastSchema) bool {
	if s != nil && !s.admits(kindObject) {
		return false
	}
	if w.nesting++; w.nesting > maxFastNesting {
		return false
	}
	w.i++ // {
	base := len(w.keys)
	var seen uint64
	n := 0
	ok := w.members(func(ks, ke int) bool {
		key := w.b[ks:ke]
		n++
		bit, tracked := -1, false
		if s != nil {
			bit, tracked = s.props[string(key)]
		}
		if tracked {
			if seen&(1<<bit) != 0 {
				return false // repeated
			}
			seen |= 1 << bit
		} else {
			for _, k := range w.keys[base:] {
				if string(w.b[k[0]:k[1]]) == string(key) {
					return false // repeated
				}
			}
			w.keys = append(w.keys, [2]int{ks, ke})
		}
		var sub *fastSchema
		if s != nil {
			switch {
			case tracked && s.inProperties&(1<<bit) != 0:
				sub = s.propSchemas[bit]
			case s.noAdditional:
				return false
			default:
				sub = s.additional
			}
			if s.propertyNames != nil && !s.propertyNames.stringHolds(key, true, w.depth) {
				return false
			}
		}
		return w.value(sub)
	})
	w.keys = w.keys[:base]
	w.nesting--
	if !ok || s == nil {
		return ok
	}
	return seen&s.required == s.required && (s.minProps < 0 || n >= s.minProps) && (s.maxProps < 0 || n <= s.maxProps)
}

// members reads an object's members after its '{', through its '}',
// calling member with each name's span (a plain name: the library reads
// escaped and non-ASCII ones) once w.i is at its value.
func (w *walker) members(member func(ks, ke int) bool) bool {
	w.space()
	if w.next('}') {
		return true
	}
	for {
		w.space()
		ks, ke, plain, ok := w.str()
		if !ok || !plain {
			return false
		}
		w.space()
		if !w.next(':') || !member(ks, ke) {
			return false
		}
		w.space()
		if w.next('}') {
			return true
		}
		if !w.next(',') {
			return false
		}
	}
}

func (w *walker) array(s *fastSchema) bool {
	if s != nil && !s.admits(kindArray) {
		return false
	}
	if w.nesting++; w.nesting > maxFastNesting {
		return false
	}
	w.i++ // [
	var items *fastSchema
	unique := false
	if s != nil {
		items, unique = s.items, s.unique
	}
	base := len(w.items)
	n := 0
	ok := w.elements(func() bool {
		start := w.i
		if !w.value(items) {
			return false
		}
		if unique {
			w.items = append(w.items, [2]int{start, w.i})
		}
		n++
		return true
	})
	ok = ok && (s == nil || ((s.minItems < 0 || n >= s.minItems) && (s.maxItems < 0 || n <= s.maxItems) &&
		(!unique || w.distinct(w.items[base:]))))
	w.items = w.items[:base]
	w.nesting--
	return ok
}

// elements reads an array's elements after its '[', through its ']',
// calling element with w.i at each.
func (w *walker) elements(element func() bool) bool {
	w.space()
	if w.next(']') {
		return true
	}
	for {
		w.space()
		if !element() {
			return false
		}
		w.space()
		if w.next(']') {
			return true
		}
		if !w.next(',') {
			return false
		}
	}
}

// distinct reports whether the items, given as spans, are all different,
// when each is a plain integer or a plain string; false otherwise (the
// library decides 1 against 1.0, objects and the rest).
func (w *walker) distinct(items [][2]int) bool {
	if len(items) < 2 {
		return true
	}
	ints, strs := w.ints[:0], w.strs[:0]
	for _, it := range items {
		v := w.b[it[0]:it[1]]
		if v[0] == '"' {
			for _, c := range v[1 : len(v)-1] {
				if c == '\\' || c >= utf8.RuneSelf {
					return false
				}
			}
			strs = append(strs, it)
			continue
		}
		n, ok := smallInt(v)
		if !ok {
			return false
		}
		ints = append(ints, n.i)
	}
	w.ints, w.strs = ints, strs
	slices.Sort(ints)
	for i := 1; i < len(ints); i++ {
		if ints[i] == ints[i-1] {
			return false
		}
	}
	if len(strs) > 1 {
		slices.SortFunc(strs, func(a, b [2]int) int {
			return bytes.Compare(w.b[a[0]:a[1]], w.b[b[0]:b[1]])
		})
		for i := 1; i < len(strs); i++ {
			if string(w.b[strs[i][0]:strs[i][1]]) == string(w.b[strs[i-1][0]:strs[i-1][1]]) {
				return false
			}
		}
	}
	return true
}
