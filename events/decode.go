package events

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// DecodeJSON decodes a JSON body into v, a pointer to an event's Go type
// (or to any value built of structs, slices, maps, strings, numbers and
// booleans), reading numbers as people and other languages write them:
// where an integer is expected, any JSON number of integral value is taken
// (8, 8.0, 7e9, -0.0, 1.048576e6), as JSON Schema's "integer" takes it.
// Python's json.dumps writes 8.0 for a float that holds 8.
//
// A value it cannot take is refused with a *DecodeError naming the field
// as the schemas do (gpus, model.layers, groups[2].ranks[0],
// labels["app.kubernetes.io/name"]) in the user's words, never in Go's:
//
//	gpus must be a whole number, got 2.5
//	gpus is out of range: 1e30 (the largest is 9223372036854775807)
//
// Every path that turns bytes into an event uses it: the bus's Decode
// (after the schema), job files (internal/client.ParseJob, so topoctl submit
// and the dry run), and the readers of stored events.
//
// A body that encoding/json takes as it is costs one decode, on the
// engine of encoding/json/v2 with encoding/json's semantics (jsonv1,
// below); only one it refuses is read again, by encoding/json itself and
// then number by number, so errors are worded as they always were. That
// number-by-number reading builds a document of the body, which a body
// of more than maxDocumentValues values, or nested past MaxDepth, does
// not get: its integral numbers are rewritten as integers in a copy of
// its bytes (8.0 as 8), which encoding/json decodes, and an error is the
// first encoding/json finds (decodeLarge). As with json.Unmarshal, v may
// be partly filled when an error is returned.
func DecodeJSON(body []byte, v any) error {
	return decodeJSON(body, v, false)
}

// DecodeJSONStrict is DecodeJSON that also refuses a property the Go type
// does not have, naming it: for files people write by hand, where a typo
// would otherwise be dropped silently.
func DecodeJSONStrict(body []byte, v any) error {
	return decodeJSON(body, v, true)
}

// DecodeProblem is one value DecodeJSON could not take.
type DecodeProblem struct {
	// Field is the path of the value as the schemas name it, such as
	// model.layers or groups[2].ranks[0]; "" is the whole body.
	Field string
	// Code is machine-readable: one of the Decode* constants.
	Code string
	// Message says what is wrong, naming the field: "gpus must be a whole
	// number, got 2.5".
	Message string
}

// Codes of DecodeProblem.
const (
	// DecodeNotWhole: a number with a fractional part where an integer is
	// expected.
	DecodeNotWhole = "not_whole_number"
	// DecodeOutOfRange: a number past what the field can hold.
	DecodeOutOfRange = "out_of_range"
	// DecodeWrongType: a value of another JSON type than the field's.
	DecodeWrongType = "wrong_type"
	// DecodeUnknownField: a property the event does not have
	// (DecodeJSONStrict only).
	DecodeUnknownField = "unknown_field"
	// DecodeNotJSON: the body is not one JSON value.
	DecodeNotJSON = "not_json"
	// DecodeInconsistent: values that each decode but do not fit
	// together (a compact jobs.analyzed whose groups cannot be rebuilt).
	DecodeInconsistent = "inconsistent"
)

// DecodeError lists every value DecodeJSON could not take, sorted by field
// (as a schema's ValidationError is).
type DecodeError struct {
	Problems []DecodeProblem
}

// maxErrorProblems bounds the problems Error lists (Problems holds them
// all): the text travels in a dead letter's header.
const maxErrorProblems = 100

func (e *DecodeError) Error() string {
	n := min(len(e.Problems), maxErrorProblems)
	msgs := make([]string, n, n+1)
	for i, p := range e.Problems[:n] {
		msgs[i] = p.Message
	}
	if more := len(e.Problems) - n; more > 0 {
		msgs = append(msgs, fmt.Sprintf("and %d more problems", more))
	}
	return strings.Join(msgs, "; ")
}

func decodeJSON(body []byte, v any, strict bool) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		// A programming error, not the body's: say it in Go's words.
		return fmt.Errorf("events: DecodeJSON into %T: want a non-nil pointer", v)
	}
	if !strict {
		if u, ok := v.(json.Unmarshaler); ok {
			// Its decoder reads the body whole, with DecodeJSON
			// (JobAnalyzed): once, not after a scan of the body here. An
			// error of another kind is read again below, as any is.
			err := u.UnmarshalJSON(body)
			if err == nil {
				return nil
			}
			var derr *DecodeError
			if errors.As(err, &derr) {
				return derr
			}
		} else if firstError(body, v, false) == nil {
			// go-json-experiment/json/v1 is encoding/json's API and
			// semantics on encoding/json/v2's decoder, what encoding/json
			// itself becomes in Go 1.27: some twice as fast on events
			// (BENCHMARKS.md). TestDecodeEngines and FuzzDecodeJSON hold
			// it to encoding/json's results; firstError stops it at its
			// first error. What it refuses, encoding/json reads again
			// below, for the errors' words, unless the body is large.
			return nil
		}
		if large(body) {
			return decodeLarge(body, v, strict)
		}
		err := json.Unmarshal(body, v)
		if err == nil {
			return nil
		}
		var serr *json.SyntaxError
		if errors.As(err, &serr) {
			return notJSON(serr)
		}
		// A type's own decoder that says what is wrong in our words.
		var derr *DecodeError
		if errors.As(err, &derr) {
			return derr
		}
	}
	if large(body) {
		return decodeLarge(body, v, strict)
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var doc any
	if err := d.Decode(&doc); err != nil {
		var serr *json.SyntaxError
		if errors.As(err, &serr) {
			return notJSON(serr)
		}
		return &DecodeError{Problems: []DecodeProblem{{Code: DecodeNotJSON, Message: "the body is not JSON: " + err.Error()}}}
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return &DecodeError{Problems: []DecodeProblem{{Code: DecodeNotJSON,
			Message: fmt.Sprintf("the body holds more than one JSON value (more at byte offset %d)", d.InputOffset())}}}
	}
	w := walker{strict: strict}
	doc = w.value(doc, rv.Type().Elem(), "")
	if len(w.probs) > 0 {
		sort.SliceStable(w.probs, func(i, j int) bool { return w.probs[i].Field < w.probs[j].Field })
		return &DecodeError{Problems: w.probs}
	}
	norm, err := json.Marshal(doc)
	if err != nil {
		// Unreachable: doc holds only what a Decoder made, numbers
		// rewritten as integers.
		return &DecodeError{Problems: []DecodeProblem{{Code: DecodeNotJSON, Message: "the body cannot be read again: " + err.Error()}}}
	}
	if err := json.Unmarshal(norm, v); err != nil {
		var derr *DecodeError
		if errors.As(err, &derr) {
			return derr
		}
		return &DecodeError{Problems: []DecodeProblem{fallback(err)}}
	}
	return nil
}

// large reports whether body is too large for a document of its own: more
// than maxDocumentValues values, or nested past MaxDepth.
func large(body []byte) bool {
	n, depth := shape(body, maxDocumentValues)
	return n > maxDocumentValues || depth > MaxDepth
}

// firstError decodes body into v with encoding/json's semantics but for
// one: it stops at the first value it cannot take. encoding/json and
// jsonv1 read on past it, making an error for each (some 600 bytes a
// value between them: 2.4 GB for an args of four million numbers), of
// which they report one.
func firstError(body []byte, v any, strict bool) error {
	return jsonv2.Unmarshal(body, v, jsonv1.DefaultOptionsV1(), jsonv1.ReportErrorsWithLegacySemantics(false),
		jsonv2.RejectUnknownMembers(strict))
}

// decodeLarge decodes a body too large for a document of its own: its
// integral numbers rewritten as integers (wholeNumbers), stopping at the
// first value it cannot take (firstError). The cost is a copy of the body
// beside what v holds.
func decodeLarge(body []byte, v any, strict bool) error {
	err := firstError(wholeNumbers(body), v, strict)
	if err == nil {
		return nil
	}
	var derr *DecodeError
	if errors.As(err, &derr) {
		return derr
	}
	var serr *jsontext.SyntacticError
	if errors.As(err, &serr) {
		return &DecodeError{Problems: []DecodeProblem{{Code: DecodeNotJSON,
			Message: fmt.Sprintf("the body is not JSON at byte offset %d: %v", serr.ByteOffset, serr.Err)}}}
	}
	var sem *jsonv2.SemanticError
	if !errors.As(err, &sem) {
		return &DecodeError{Problems: []DecodeProblem{{Code: DecodeWrongType, Message: "the body cannot be read: " + err.Error()}}}
	}
	field := pointerField(sem.JSONPointer)
	switch {
	case errors.Is(sem.Err, jsonv2.ErrUnknownName):
		return &DecodeError{Problems: []DecodeProblem{{Field: field, Code: DecodeUnknownField,
			Message: fmt.Sprintf("%s is not a known field", name(field))}}}
	case sem.JSONKind == '0' && sem.GoType != nil && sem.GoType.Kind() >= reflect.Int && sem.GoType.Kind() <= reflect.Uintptr:
		// wholeNumbers made every integral number an integer: this one
		// has a fraction, or is past the field's range.
		lit := string(sem.JSONValue)
		if _, _, whole, _ := integral(lit); !whole {
			return &DecodeError{Problems: []DecodeProblem{{Field: field, Code: DecodeNotWhole,
				Message: fmt.Sprintf("%s must be a whole number, got %s", name(field), clip(lit))}}}
		}
		return &DecodeError{Problems: []DecodeProblem{{Field: field, Code: DecodeOutOfRange,
			Message: fmt.Sprintf("%s is out of range: %s", name(field), clip(lit))}}}
	}
	got := "another value"
	switch sem.JSONKind {
	case '"':
		got = "a string"
	case '0':
		got = "a number"
	case 't', 'f':
		got = "true or false"
	case '[':
		got = "a list"
	case '{':
		got = "an object"
	case 'n':
		got = "null"
	}
	return &DecodeError{Problems: []DecodeProblem{{Field: field, Code: DecodeWrongType,
		Message: fmt.Sprintf("%s must be %s, got %s", name(field), kindWords(sem.GoType), got)}}}
}

// pointerField names the value at a JSON pointer as the schemas do:
// /groups/2/ranks/0 is groups[2].ranks[0].
func pointerField(p jsontext.Pointer) string {
	field := ""
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil {
			field += "[" + tok + "]"
			continue
		}
		field = appendKey(field, tok)
	}
	return field
}

// wholeNumbers is body with every number of integral value that is not
// written as a plain integer (8.0, 7e9, 1.048576e6) rewritten as one, as
// DecodeJSON's walk does where an integer is wanted; a float reads the
// same either way. Numbers past maxIntegerDigits digits, strings and the
// rest are copied as they are.
func wholeNumbers(body []byte) []byte {
	out := make([]byte, 0, len(body))
	for i := 0; i < len(body); {
		c := body[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(body) && body[j] != '"' {
				if body[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(body))
			out = append(out, body[i:j]...)
			i = j
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(body) && strings.IndexByte("+-0123456789.eE", body[j]) >= 0 {
				j++
			}
			lit := string(body[i:j])
			if digits, neg, whole, big := integral(lit); whole && !big && strings.ContainsAny(lit, ".eE") && numberLiteral.MatchString(lit) {
				if neg {
					out = append(out, '-')
				}
				out = append(out, digits...)
			} else {
				out = append(out, lit...)
			}
			i = j
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

func notJSON(serr *json.SyntaxError) error {
	return &DecodeError{Problems: []DecodeProblem{{Code: DecodeNotJSON,
		Message: fmt.Sprintf("the body is not JSON at byte offset %d: %v", serr.Offset, serr)}}}
}

// fallback words an error of encoding/json that the walk did not foresee
// (a custom decoder's), without Go's type names.
func fallback(err error) DecodeProblem {
	var terr *json.UnmarshalTypeError
	if errors.As(err, &terr) {
		field := terr.Field
		if field == "" {
			field = "the body"
		}
		return DecodeProblem{Field: terr.Field, Code: DecodeWrongType,
			Message: fmt.Sprintf("%s must be %s, got %s", field, kindWords(terr.Type), terr.Value)}
	}
	return DecodeProblem{Code: DecodeWrongType, Message: "the body cannot be read: " + err.Error()}
}

// walker checks a document decoded with UseNumber against a Go type,
// rewriting integral numbers where integers are expected as plain integer
// literals, and collecting what it cannot take.
type walker struct {
	strict bool
	probs  []DecodeProblem
}

func (w *walker) add(field, code, format string, args ...any) {
	w.probs = append(w.probs, DecodeProblem{Field: field, Code: code, Message: fmt.Sprintf(format, args...)})
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
	numberType      = reflect.TypeFor[json.Number]()
	rawType         = reflect.TypeFor[json.RawMessage]()
	timeType        = reflect.TypeFor[time.Time]()
)

// value checks x, found at field, against t and returns it, or what
// replaces it.
func (w *walker) value(x any, t reflect.Type, field string) any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if x == nil {
		return nil // null leaves a Go value as it is
	}
	switch {
	case t == timeType:
		s, ok := x.(string)
		if !ok {
			w.wrongType(field, "a date-time string such as 2025-03-14T09:26:53Z", x)
		} else if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			w.add(field, DecodeWrongType, "%s must be an RFC 3339 date-time such as 2025-03-14T09:26:53Z, got %s", name(field), quote(s))
		}
		return x
	case t == numberType:
		if _, ok := x.(json.Number); !ok {
			if _, ok := x.(string); !ok {
				w.wrongType(field, "a number", x)
			}
		}
		return x
	case t == rawType, t.Kind() == reflect.Interface:
		return x
	case reflect.PointerTo(t).Implements(jsonUnmarshaler) || t.Implements(jsonUnmarshaler):
		return x // its own decoder decides
	}
	switch k := t.Kind(); {
	case k >= reflect.Int && k <= reflect.Int64, k >= reflect.Uint && k <= reflect.Uintptr:
		n, ok := x.(json.Number)
		if !ok {
			w.wrongType(field, "a whole number", x)
			return x
		}
		return w.integer(n, k, t.Bits(), field)
	case k == reflect.Float32 || k == reflect.Float64:
		n, ok := x.(json.Number)
		if !ok {
			w.wrongType(field, "a number", x)
			return x
		}
		if _, err := strconv.ParseFloat(string(n), t.Bits()); err != nil {
			w.add(field, DecodeOutOfRange, "%s is out of range: %s", name(field), clip(string(n)))
		}
		return x
	case k == reflect.String:
		if _, ok := x.(string); !ok {
			w.wrongType(field, "a string", x)
		}
		return x
	case k == reflect.Bool:
		if _, ok := x.(bool); !ok {
			w.wrongType(field, "true or false", x)
		}
		return x
	case k == reflect.Struct:
		obj, ok := x.(map[string]any)
		if !ok {
			w.wrongType(field, "an object", x)
			return x
		}
		fs := fieldsOf(t)
		for _, key := range sortedKeys(obj) {
			f, ok := fs.lookup(key)
			if !ok {
				if w.strict {
					w.add(appendKey(field, key), DecodeUnknownField, "%s is not a known field", name(appendKey(field, key)))
				}
				continue
			}
			obj[key] = w.value(obj[key], f, appendKey(field, key))
		}
		return obj
	case k == reflect.Map:
		obj, ok := x.(map[string]any)
		if !ok {
			w.wrongType(field, "an object", x)
			return x
		}
		kk := t.Key().Kind()
		textKey := reflect.PointerTo(t.Key()).Implements(textUnmarshaler)
		for _, key := range sortedKeys(obj) {
			kf := appendKey(field, key)
			if !textKey && kk != reflect.String {
				w.mapKey(key, t.Key(), kf)
			}
			obj[key] = w.value(obj[key], t.Elem(), kf)
		}
		return obj
	case k == reflect.Slice && t.Elem().Kind() == reflect.Uint8 &&
		!reflect.PointerTo(t.Elem()).Implements(jsonUnmarshaler) && !reflect.PointerTo(t.Elem()).Implements(textUnmarshaler):
		if _, ok := x.(string); !ok {
			w.wrongType(field, "a base64 string", x)
		}
		return x
	case k == reflect.Slice || k == reflect.Array:
		arr, ok := x.([]any)
		if !ok {
			w.wrongType(field, "a list", x)
			return x
		}
		for i := range arr {
			arr[i] = w.value(arr[i], t.Elem(), field+"["+strconv.Itoa(i)+"]")
		}
		return arr
	}
	return x
}

// mapKey checks the key of a map with integer keys.
func (w *walker) mapKey(key string, t reflect.Type, field string) {
	k := t.Kind()
	if k < reflect.Int || k > reflect.Uintptr {
		return // string-like keys: anything goes
	}
	var err error
	if k >= reflect.Uint {
		_, err = strconv.ParseUint(key, 10, t.Bits())
	} else {
		_, err = strconv.ParseInt(key, 10, t.Bits())
	}
	if err != nil {
		w.add(field, DecodeWrongType, "%s: the key %s must be a whole number", name(field), quote(key))
	}
}

// integer rewrites n as an integer literal of a Go integer of kind k and
// size bits, or records why it cannot be one.
func (w *walker) integer(n json.Number, k reflect.Kind, bits int, field string) any {
	digits, neg, whole, big := integral(string(n))
	if !whole {
		w.add(field, DecodeNotWhole, "%s must be a whole number, got %s", name(field), clip(string(n)))
		return n
	}
	unsigned := k >= reflect.Uint
	lo, hi := "0", strconv.FormatUint(math.MaxUint64>>(64-bits), 10)
	if !unsigned {
		lo, hi = strconv.FormatInt(math.MinInt64>>(64-bits), 10), strconv.FormatInt(math.MaxInt64>>(64-bits), 10)
	}
	if neg && digits != "0" {
		digits = "-" + digits
	}
	var err error
	if !big {
		if unsigned {
			_, err = strconv.ParseUint(digits, 10, bits)
		} else {
			_, err = strconv.ParseInt(digits, 10, bits)
		}
	}
	if big || err != nil {
		bound := "the largest is " + hi
		if neg {
			bound = "the smallest is " + lo
		}
		w.add(field, DecodeOutOfRange, "%s is out of range: %s (%s)", name(field), clip(string(n)), bound)
		return n
	}
	return json.Number(digits)
}

// maxIntegerDigits is more digits than any 64-bit integer has.
const maxIntegerDigits = 20

// integral reads a JSON number literal exactly: whether it is a whole
// number and, if it is and has at most maxIntegerDigits digits, its decimal
// digits without sign or leading zeros ("0" for zero). big reports a whole
// number with more digits than that. The literal must be a valid JSON
// number (as a Decoder gives); exponents of any size cost nothing.
func integral(s string) (digits string, neg, whole, big bool) {
	neg = strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expPart, hasExp := strings.Cut(strings.ToLower(s), "e")
	exp := int64(0)
	if hasExp {
		// On a valid literal only a range error is possible, and then
		// ParseInt gives the nearest int64: as good, since no number has
		// that many digits. Clamping keeps the sums below from overflowing.
		e, _ := strconv.ParseInt(expPart, 10, 64)
		exp = max(min(e, math.MaxInt32), math.MinInt32)
	}
	intPart, fracPart, _ := strings.Cut(mant, ".")
	all := strings.TrimLeft(intPart+fracPart, "0")
	if all == "" {
		return "0", neg, true, false
	}
	exp -= int64(len(fracPart))
	trimmed := strings.TrimRight(all, "0")
	exp += int64(len(all) - len(trimmed))
	if exp < 0 {
		return "", neg, false, false
	}
	if int64(len(trimmed))+exp > maxIntegerDigits {
		return "", neg, true, true
	}
	return trimmed + strings.Repeat("0", int(exp)), neg, true, false
}

func (w *walker) wrongType(field, want string, got any) {
	w.add(field, DecodeWrongType, "%s must be %s, got %s", name(field), want, describe(got))
}

// describe says what a decoded JSON value is, for a message.
func describe(x any) string {
	switch x := x.(type) {
	case string:
		return "the string " + quote(x)
	case json.Number:
		return "the number " + clip(string(x))
	case bool:
		return strconv.FormatBool(x)
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	}
	return "null"
}

// kindWords says what JSON a Go type takes, for the fallback message.
func kindWords(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch k := t.Kind(); {
	case k >= reflect.Int && k <= reflect.Uintptr:
		return "a whole number"
	case k == reflect.Float32 || k == reflect.Float64:
		return "a number"
	case k == reflect.String:
		return "a string"
	case k == reflect.Bool:
		return "true or false"
	case k == reflect.Slice || k == reflect.Array:
		return "a list"
	case k == reflect.Struct || k == reflect.Map:
		return "an object"
	}
	return "another value"
}

// name is a field for a message; the whole body has no field.
func name(field string) string {
	if field == "" {
		return "the body"
	}
	return field
}

// clip shortens a literal quoted in a message, as the schemas do.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func quote(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strconv.Quote(s)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// numberLiteral is a JSON number: wholeNumbers rewrites no other text,
// so that what is not JSON stays so.
var numberLiteral = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// simpleKey is a property name that reads unambiguously after a dot.
var simpleKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// appendKey adds a property to a dotted path as the schemas package does,
// quoting keys that hold dots or other punctuation, such as
// labels["app.kubernetes.io/name"].
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

// structFields are the JSON properties of a struct type, as encoding/json
// sees them: by tag name, embedded structs' fields promoted.
type structFields struct {
	exact map[string]reflect.Type
	// folded holds lower-cased names: encoding/json matches a property
	// to a field case-insensitively when no name matches exactly.
	folded map[string]reflect.Type
}

func (f structFields) lookup(key string) (reflect.Type, bool) {
	if t, ok := f.exact[key]; ok {
		return t, true
	}
	t, ok := f.folded[strings.ToLower(key)]
	return t, ok
}

var fieldCache sync.Map // reflect.Type → structFields

func fieldsOf(t reflect.Type) structFields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(structFields)
	}
	f := structFields{exact: map[string]reflect.Type{}, folded: map[string]reflect.Type{}}
	collectFields(t, f, map[reflect.Type]bool{})
	fieldCache.Store(t, f)
	return f
}

// collectFields adds t's fields to f, shallower fields first so that they
// win over promoted ones of the same name.
func collectFields(t reflect.Type, f structFields, seen map[reflect.Type]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	var embedded []reflect.Type
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		tagName, _, _ := strings.Cut(tag, ",")
		if sf.Anonymous && tagName == "" {
			et := sf.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				embedded = append(embedded, et)
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		n := tagName
		if n == "" {
			n = sf.Name
		}
		if _, ok := f.exact[n]; !ok {
			f.exact[n] = sf.Type
		}
		if _, ok := f.folded[strings.ToLower(n)]; !ok {
			f.folded[strings.ToLower(n)] = sf.Type
		}
	}
	for _, et := range embedded {
		collectFields(et, f, seen)
	}
}
