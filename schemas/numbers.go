package schemas

// Numbers checked in machine arithmetic where it decides exactly.
//
// jsonschema v6 checks "type": "integer" and every bound (minimum, maximum,
// ...) of every number in a body through fmt.Sprint and big.Rat.SetString:
// a third of validating a placement.decided, which holds some thirty
// numbers. compile moves the keywords of each plain numeric schema (a type
// of integer or number and its bounds, with nothing else that validates)
// into one keyword of this package's vocabulary, numberKeyword, which gives
// the same verdicts and reports the same errors (kind.Type, kind.Minimum,
// ...): integers that fit in an int64 and numbers far from a bound are
// compared as machine numbers, anything closer in big.Rat, as the library
// does. The schema files are unchanged; only the compiled form differs.
// TestNumberVocabularyAgrees holds the two to the same answers.

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// numberKeyword holds a plain numeric schema's type and bounds in the
// compiled form; numberVocab is its vocabulary.
const numberKeyword = "x-toposched-number"

var numberVocab = &jsonschema.Vocabulary{URL: BaseURL + "vocab/number", Compile: compileNumber}

// boundKeys are the numeric bounds, in the order the library checks them.
var boundKeys = []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}

// inertKeys annotate a schema without validating anything.
var inertKeys = map[string]bool{"description": true, "title": true, "$comment": true, "examples": true,
	"default": true, "deprecated": true, "readOnly": true, "writeOnly": true}

// eachSchema calls fn on every schema object of a schema document, at any
// depth where a schema may be, inner ones first.
func eachSchema(sch any, fn func(map[string]any)) {
	obj, ok := sch.(map[string]any)
	if !ok {
		return
	}
	for k, v := range obj {
		switch k {
		case "properties", "patternProperties", "$defs", "definitions", "dependentSchemas":
			if m, ok := v.(map[string]any); ok {
				for _, s := range m {
					eachSchema(s, fn)
				}
			}
		case "allOf", "anyOf", "oneOf", "prefixItems", "items":
			if a, ok := v.([]any); ok {
				for _, s := range a {
					eachSchema(s, fn)
				}
			} else {
				eachSchema(v, fn)
			}
		case "additionalProperties", "contains", "propertyNames", "not", "if", "then", "else",
			"unevaluatedProperties", "unevaluatedItems", "additionalItems":
			eachSchema(v, fn)
		}
	}
	fn(obj)
}

// rewriteNumbers rewrites, in place, the plain numeric schemas of a schema
// document into numberKeyword.
func rewriteNumbers(sch any) { eachSchema(sch, rewriteNumber) }

func rewriteNumber(obj map[string]any) {
	t, _ := obj["type"].(string)
	if t != "integer" && t != "number" {
		return
	}
	for k := range obj {
		if k != "type" && !inertKeys[k] && !slices.Contains(boundKeys, k) {
			return // enum, $ref, anyOf...: the library's order of checks matters there
		}
	}
	spec := map[string]any{"type": t}
	delete(obj, "type")
	for _, k := range boundKeys {
		if v, ok := obj[k]; ok {
			spec[k] = v
			delete(obj, k)
		}
	}
	obj[numberKeyword] = spec
}

// bound is one numeric bound of a schema, exact and as machine numbers.
type bound struct {
	key   string
	rat   *big.Rat
	f     float64
	i     int64
	isInt bool // i holds it exactly
}

// numberCheck is a compiled numberKeyword.
type numberCheck struct {
	integer bool
	want    []string // the type, as the library's error names it
	bounds  []bound
}

func compileNumber(_ *jsonschema.CompilerContext, obj map[string]any) (jsonschema.SchemaExt, error) {
	raw, ok := obj[numberKeyword]
	if !ok {
		return nil, nil
	}
	spec, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("schemas: %s: not an object", numberKeyword)
	}
	t, _ := spec["type"].(string)
	c := &numberCheck{integer: t == "integer", want: []string{t}}
	for _, k := range boundKeys {
		v, ok := spec[k]
		if !ok {
			continue
		}
		b, err := newBound(k, fmt.Sprint(v))
		if err != nil {
			return nil, fmt.Errorf("schemas: %w", err)
		}
		c.bounds = append(c.bounds, b)
	}
	return c, nil
}

// Validate checks v's type and bounds, reporting what the library would.
func (c *numberCheck) Validate(ctx *jsonschema.ValidatorContext, v any) {
	var lit string
	switch x := v.(type) {
	case json.Number:
		lit = string(x)
	case float32, float64, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		lit = fmt.Sprint(x)
	default:
		ctx.AddError(&kind.Type{Got: jsonTypeOf(v), Want: c.want})
		return
	}
	n := parseNumber(lit)
	if c.integer && !n.integral() {
		ctx.AddError(&kind.Type{Got: "number", Want: c.want})
		return
	}
	for _, b := range c.bounds {
		if holds(&n, b) {
			continue
		}
		switch b.key {
		case "multipleOf":
			ctx.AddError(&kind.MultipleOf{Got: n.exact(), Want: b.rat})
		case "minimum":
			ctx.AddError(&kind.Minimum{Got: n.exact(), Want: b.rat})
		case "maximum":
			ctx.AddError(&kind.Maximum{Got: n.exact(), Want: b.rat})
		case "exclusiveMinimum":
			ctx.AddError(&kind.ExclusiveMinimum{Got: n.exact(), Want: b.rat})
		case "exclusiveMaximum":
			ctx.AddError(&kind.ExclusiveMaximum{Got: n.exact(), Want: b.rat})
		}
	}
}

// holds reports whether the number keyword's check passes: integral if
// asked, within every bound (the fast path's reading; Validate reports).
func (c *numberCheck) holds(n *number) bool {
	if c.integer && !n.integral() {
		return false
	}
	for _, b := range c.bounds {
		if !holds(n, b) {
			return false
		}
	}
	return true
}

// holds reports whether n meets one bound.
func holds(n *number, b bound) bool {
	if b.key == "multipleOf" {
		return new(big.Rat).Quo(n.exact(), b.rat).IsInt()
	}
	cmp := cmpNumber(n, b)
	switch b.key {
	case "minimum":
		return cmp >= 0
	case "maximum":
		return cmp <= 0
	case "exclusiveMinimum":
		return cmp > 0
	case "exclusiveMaximum":
		return cmp < 0
	}
	return cmp == 0
}

// cmpNumber compares n with b's value exactly.
func cmpNumber(n *number, b bound) int {
	if cmp, ok := n.cmpFast(b); ok {
		return cmp
	}
	return n.exact().Cmp(b.rat)
}

// newBound reads a bound's literal.
func newBound(key, lit string) (bound, error) {
	r, ok := new(big.Rat).SetString(lit)
	if !ok {
		return bound{}, fmt.Errorf("%s: %s is not a number", key, lit)
	}
	return ratBound(key, r), nil
}

// ratBound is a bound of an exact value, as machine numbers too.
func ratBound(key string, r *big.Rat) bound {
	b := bound{key: key, rat: r}
	b.f, _ = r.Float64()
	if r.IsInt() && r.Num().IsInt64() {
		b.i, b.isInt = r.Num().Int64(), true
	}
	return b
}

// number is a JSON number literal as machine numbers where they hold it,
// and exactly once asked (exact).
type number struct {
	lit   string
	i     int64
	isInt bool // a plain integer literal that i holds
	f     float64
	isF   bool // f is finite
	rat   *big.Rat
}

func parseNumber(lit string) number {
	n := number{lit: lit}
	if plainInt(lit) {
		if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
			n.i, n.isInt = i, true
			n.f, n.isF = float64(i), true
			return n
		}
	}
	if f, err := strconv.ParseFloat(lit, 64); err == nil && !math.IsInf(f, 0) {
		n.f, n.isF = f, true
	}
	return n
}

// plainInt reports whether lit is an optional minus and digits.
func plainInt(lit string) bool {
	s := lit
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// exact is the number as the library reads it.
func (n *number) exact() *big.Rat {
	if n.rat == nil && n.lit == "" && n.isInt {
		n.rat = new(big.Rat).SetInt64(n.i) // read by smallInt, which keeps no literal
	}
	if n.rat == nil {
		n.rat, _ = new(big.Rat).SetString(n.lit)
		if n.rat == nil {
			n.rat = new(big.Rat) // unreachable for a literal the parser took
		}
	}
	return n.rat
}

func (n *number) integral() bool {
	return n.isInt || n.exact().IsInt()
}

// cmpFast compares n with b when machine numbers decide it exactly: two
// integers in int64, or two floats further apart than any rounding of a
// decimal literal to float64 could move them.
func (n *number) cmpFast(b bound) (int, bool) {
	switch {
	case n.isInt && b.isInt:
		switch {
		case n.i < b.i:
			return -1, true
		case n.i > b.i:
			return 1, true
		}
		return 0, true
	case n.isF && !math.IsInf(b.f, 0):
		if d := n.f - b.f; math.Abs(d) > 1e-9*math.Max(1, math.Max(math.Abs(n.f), math.Abs(b.f))) {
			if d < 0 {
				return -1, true
			}
			return 1, true
		}
	}
	return 0, false
}

// jsonTypeOf names a decoded value's JSON type as the library's errors do.
func jsonTypeOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "number"
}
