package schemas

// uniqueItems checked by key, not by pairs.
//
// jsonschema v6 checks "uniqueItems" by comparing items pairwise (up to
// 20 items; by hash beyond), and compares two numbers by formatting each
// with fmt.Sprint and parsing it into a big.Rat: the GPU indexes of every
// node of a placement.decided ("uniqueItems": true in common.schema.json)
// cost 28 such comparisons per 8-GPU node, a quarter of validating the
// event. compile moves each "uniqueItems": true into uniqueKeyword of this
// package's vocabulary, which finds the same first duplicate (the first
// item equal to an earlier one, and the first such earlier one) through
// one canonical key per item, and reports it as the library does
// (kind.UniqueItems). TestUniqueVocabularyAgrees holds the two to the
// same answers.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strconv"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// uniqueKeyword holds "uniqueItems": true in the compiled form;
// uniqueVocab is its vocabulary.
const uniqueKeyword = "x-toposched-unique-items"

var uniqueVocab = &jsonschema.Vocabulary{URL: BaseURL + "vocab/unique", Compile: compileUnique}

// rewriteUnique rewrites, in place, every "uniqueItems": true of a schema
// document into uniqueKeyword.
func rewriteUnique(sch any) {
	eachSchema(sch, func(obj map[string]any) {
		if u, ok := obj["uniqueItems"].(bool); ok && u {
			delete(obj, "uniqueItems")
			obj[uniqueKeyword] = true
		}
	})
}

func compileUnique(_ *jsonschema.CompilerContext, obj map[string]any) (jsonschema.SchemaExt, error) {
	if u, ok := obj[uniqueKeyword].(bool); !ok || !u {
		return nil, nil
	}
	return uniqueCheck{}, nil
}

// uniqueCheck is a compiled uniqueKeyword.
type uniqueCheck struct{}

// Validate reports the first item of an array equal to an earlier one.
func (uniqueCheck) Validate(ctx *jsonschema.ValidatorContext, v any) {
	arr, ok := v.([]any)
	if !ok || len(arr) < 2 {
		return
	}
	first := make(map[string]int, len(arr))
	var buf []byte
	for i, item := range arr {
		buf, ok = appendItemKey(buf[:0], item)
		if !ok {
			continue // equal to nothing, as the library finds it
		}
		if j, seen := first[string(buf)]; seen {
			ctx.AddError(&kind.UniqueItems{Duplicates: [2]int{j, i}})
			return
		}
		first[string(buf)] = i
	}
}

// appendItemKey appends a key of v that another JSON value has exactly when
// the library finds the two equal: numbers by value (1, 1.0 and 1e0 are
// one), objects whatever their keys' order. It reports false for a value
// the library finds equal to nothing (a number big.Rat cannot read, or
// one holding one).
func appendItemKey(b []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), true
	case bool:
		return strconv.AppendBool(b, x), true
	case string:
		return strconv.AppendQuote(b, x), true
	case json.Number:
		lit := string(x)
		if plainInt(lit) {
			if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
				return strconv.AppendInt(b, i, 10), true
			}
		}
		r, ok := new(big.Rat).SetString(lit)
		if !ok {
			return b, false
		}
		return append(b, r.RatString()...), true
	case []any:
		b = append(b, '[')
		for i, item := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendItemKey(b, item); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case map[string]any:
		b = append(b, '{')
		for i, k := range slices.Sorted(maps.Keys(x)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, k)
			b = append(b, ':')
			var ok bool
			if b, ok = appendItemKey(b, x[k]); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	}
	switch v.(type) {
	case float32, float64, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		// Go numbers (a document not read by decode): by value, as the
		// library reads them.
		if r, ok := new(big.Rat).SetString(fmt.Sprint(v)); ok {
			return append(b, r.RatString()...), true
		}
	}
	return b, false
}
