package gateway

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// checkShape walks a YAML document against the Config type before it is
// decoded, so that a misspelt key or a value of the wrong kind is reported
// by its path in the file (admission.queue.max_request) in the operator's
// terms, not as a line number and a Go type name. It finds every such
// problem, in document order.
func checkShape(doc *yaml.Node) error {
	if doc == nil || doc.Kind == 0 {
		return nil
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil
		}
		doc = doc.Content[0]
	}
	var errs []error
	walkShape(doc, reflect.TypeFor[Config](), "", &errs)
	return errors.Join(errs...)
}

// A type that reads its own text (confval's Duration and Size, the shared
// budget's Chunk) takes a single value and checks it itself, by path.
var (
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func walkShape(n *yaml.Node, t reflect.Type, path string, errs *[]error) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	bad := func(format string, a ...any) {
		where := path
		if where == "" {
			where = "the file"
		}
		*errs = append(*errs, fmt.Errorf("%s: %s (line %d)", where, fmt.Sprintf(format, a...), n.Line))
	}
	if isNull(n) {
		return // an empty value is the default
	}
	if pt := reflect.PointerTo(t); pt.Implements(unmarshalerType) || pt.Implements(textUnmarshalerType) {
		if n.Kind != yaml.ScalarNode {
			bad("want a single value, got %s", kindName(n))
		}
		return // Duration and Size check their text themselves, by path
	}
	switch t.Kind() {
	case reflect.Pointer:
		walkShape(n, t.Elem(), path, errs)
	case reflect.Struct, reflect.Map:
		if n.Kind != yaml.MappingNode {
			bad("want a mapping of keys, got %s", kindName(n))
			return
		}
		walkMapping(n, t, path, errs)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			bad("want a list, got %s", kindName(n))
			return
		}
		for i, item := range n.Content {
			walkShape(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs)
		}
	default:
		if want := scalarWant(n, t.Kind()); want != "" {
			bad("want %s, got %s", want, kindName(n))
		}
	}
}

// walkMapping walks the keys of mapping n: a struct's, each of which must
// be one of its fields, or a map's.
func walkMapping(n *yaml.Node, t reflect.Type, path string, errs *[]error) {
	if t.Kind() == reflect.Map {
		for i := 0; i+1 < len(n.Content); i += 2 {
			walkShape(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), errs)
		}
		return
	}
	fields := yamlFields(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		f, ok := fields[k.Value]
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: unknown key (line %d); the keys here are %s", join(path, k.Value), k.Line, strings.Join(fieldOrder(t), ", ")))
			continue
		}
		walkShape(v, f, join(path, k.Value), errs)
	}
}

// scalarWant is what a field of kind k wants where n is not it ("" where
// n fits).
func scalarWant(n *yaml.Node, k reflect.Kind) string {
	switch k {
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			return "a string"
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			return "true or false"
		}
	case reflect.Int, reflect.Int64:
		if _, err := strconv.ParseInt(n.Value, 0, 64); n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || err != nil {
			return "a whole number"
		}
	case reflect.Float64:
		if tag := n.ShortTag(); n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") {
			return "a number"
		}
	}
	return ""
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// kindName describes a node for an error: a scalar by its text.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps a struct's YAML keys to their field types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	eachKey(t, func(name string, ft reflect.Type) { m[name] = ft })
	return m
}

// fieldOrder is a struct's YAML keys in declaration order.
func fieldOrder(t reflect.Type) []string {
	var names []string
	eachKey(t, func(name string, _ reflect.Type) { names = append(names, name) })
	return names
}

// eachKey calls f for each YAML key of struct t in declaration order, the
// keys of an inlined struct (yaml:",inline", as gateway's TenantConfig
// holds admission's) in its place.
func eachKey(t reflect.Type, f func(name string, ft reflect.Type)) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if isInline(sf) {
			eachKey(sf.Type, f)
		} else if name := yamlName(sf); name != "" {
			f(name, sf.Type)
		}
	}
}

func isInline(f reflect.StructField) bool {
	_, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return f.Type.Kind() == reflect.Struct && slices.Contains(strings.Split(opts, ","), "inline")
}

func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}
