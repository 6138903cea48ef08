package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
)

// Field checks for request bodies. encoding/json drops keys it does not
// know and matches the ones it does case-insensitively, so on its own a
// misspelt option (allowInternetAccess for allow_internet_access,
// network.deny_out for denyOut) is answered 201 and changes nothing. The
// rules (docs/network.md, "Fields"):
//   - inside objects that set a sandbox's boundary (network, the lifecycle
//     options, volumeMounts and accelerators entries, the whole PUT
//     /network body) every key must be one this server implements;
//   - at the top level, a key that differs from a known one only in case,
//     '_' or '-' is refused, naming the known one;
//   - any other unknown top-level key is accepted, for newer SDKs, and
//     counted (cubicle_api_unknown_fields_total).

// fieldError is the 400 for a refused key. Object is where it was ("" for
// the top level), Known the field it was probably meant to be.
type fieldError struct {
	Object, Field, Known string
	known                []string // every key the object has, for the message
}

func (e *fieldError) Error() string {
	where := ""
	if e.Object != "" {
		where = e.Object + ": "
	}
	if e.Known != "" {
		return fmt.Sprintf("%sunknown field %q: the field is %q (names are matched exactly)", where, e.Field, e.Known)
	}
	return fmt.Sprintf("%sunknown field %q: not supported by this server (known: %s)", where, e.Field, strings.Join(e.known, ", "))
}

// fieldSet is the JSON keys a struct type decodes.
type fieldSet struct {
	exact map[string]bool
	// folded maps a key with case, '_' and '-' folded away to the known key.
	folded map[string]string
	sorted []string
}

var fieldSets sync.Map // reflect.Type -> *fieldSet

// fieldsOf returns the JSON keys of struct type t (nil for other kinds).
func fieldsOf(t reflect.Type) *fieldSet {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	if fs, ok := fieldSets.Load(t); ok {
		return fs.(*fieldSet)
	}
	fs := &fieldSet{exact: map[string]bool{}, folded: map[string]string{}}
	fs.add(t)
	sort.Strings(fs.sorted)
	fieldSets.Store(t, fs)
	return fs
}

// add records t's keys, and those of untagged embedded structs, whose
// fields encoding/json promotes.
func (fs *fieldSet) add(t reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && tag == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				fs.add(ft)
				continue
			}
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		name := tag
		if name == "" {
			name = f.Name
		}
		fs.exact[name] = true
		fs.folded[fold(name)] = name
		fs.sorted = append(fs.sorted, name)
	}
}

func fold(k string) string {
	return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(k))
}

// keys returns the keys of a JSON object in raw; ok is false when raw is
// not an object (null, an array...), which the typed decode then judges.
func keys(raw []byte) ([]string, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, true
}

// checkStrict refuses any key of the object raw that struct type t does not
// declare exactly.
func checkStrict(object string, raw []byte, t reflect.Type) error {
	fs := fieldsOf(t)
	ks, ok := keys(raw)
	if !ok || fs == nil {
		return nil
	}
	for _, k := range ks {
		if fs.exact[k] {
			continue
		}
		return &fieldError{Object: object, Field: k, Known: fs.folded[fold(k)], known: fs.sorted}
	}
	return nil
}

// checkTop refuses top-level near misses of known keys and returns the
// unknown keys it lets through.
func checkTop(raw []byte, t reflect.Type) ([]string, error) {
	fs := fieldsOf(t)
	ks, ok := keys(raw)
	if !ok || fs == nil {
		return nil, nil
	}
	var unknown []string
	for _, k := range ks {
		if fs.exact[k] {
			continue
		}
		if known, ok := fs.folded[fold(k)]; ok {
			return nil, &fieldError{Field: k, Known: known}
		}
		unknown = append(unknown, k)
	}
	return unknown, nil
}

// strictBody marks a request type whose top level is a boundary object too
// (the PUT /network body): no unknown key is let through.
type strictBody interface{ strictName() string }

// decodeStrictObject is the UnmarshalJSON of a boundary object: the keys are
// checked against plain (a pointer to the method-less twin of the type),
// then decoded into it.
func decodeStrictObject(object string, raw []byte, plain any) error {
	if t := bytes.TrimSpace(raw); bytes.Equal(t, []byte("null")) {
		return nil
	}
	if err := checkStrict(object, raw, reflect.TypeOf(plain)); err != nil {
		return err
	}
	return json.Unmarshal(raw, plain)
}
