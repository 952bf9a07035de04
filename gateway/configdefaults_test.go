package gateway

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// configKeys calls key for every key of the file that t (Config) reads,
// depth first: interior for a section or a list of sections, which has
// keys below it.
func configKeys(t reflect.Type, path string, key func(path string, interior bool)) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if pt := reflect.PointerTo(t); path != "" && (pt.Implements(unmarshalerType) || pt.Implements(textUnmarshalerType)) {
		key(path, false)
		return
	}
	elem := t
	if t.Kind() == reflect.Slice {
		for elem = t.Elem(); elem.Kind() == reflect.Pointer; elem = elem.Elem() {
		}
	}
	switch {
	case t.Kind() == reflect.Struct:
		if path != "" && !strings.HasSuffix(path, "[]") {
			key(path, true)
		}
		eachKey(t, func(name string, ft reflect.Type) { configKeys(ft, join(path, name), key) })
	case t.Kind() == reflect.Slice && elem.Kind() == reflect.Struct:
		key(path, true)
		configKeys(elem, path+"[]", key)
	default:
		key(path, false)
	}
}

// covers says whether the table's row d is the one of key: its own, or
// that of a whole the key lies in.
func (d configDefault) covers(key string) bool {
	return d.path == key || (d.whole && (strings.HasPrefix(key, d.path+".") || strings.HasPrefix(key, d.path+"[].")))
}

// Every key of the file has exactly one row of defaults, with a doc line;
// every row is a key of the file, and a value the gateway fills is of the
// key's kind.
func TestConfigDefaultsTableHasEveryKeyOnce(t *testing.T) {
	interior := map[string]bool{}
	var leaves []string
	configKeys(reflect.TypeFor[Config](), "", func(path string, in bool) {
		interior[path] = in
		if !in {
			leaves = append(leaves, path)
		}
	})
	for _, k := range leaves {
		var rows []string
		for _, d := range configDefaults {
			if d.covers(k) {
				rows = append(rows, d.path)
			}
		}
		if len(rows) != 1 {
			t.Errorf("key %s has %d rows of defaults %v, want 1", k, len(rows), rows)
		}
	}
	seen := map[string]bool{}
	for _, d := range configDefaults {
		in, ok := interior[d.path]
		switch {
		case !ok:
			t.Errorf("row %s: no such key in the file", d.path)
		case seen[d.path]:
			t.Errorf("row %s: listed twice", d.path)
		case d.doc == "":
			t.Errorf("row %s: no doc line", d.path)
		case strings.Contains(d.shown, "%s") && d.value == nil:
			t.Errorf("row %s: shown %q formats no value", d.path, d.shown)
		case d.value != nil && in:
			t.Errorf("row %s: a section has no value of its own", d.path)
		case d.value != nil && d.by == "":
			checkKind(t, d)
		}
		seen[d.path] = true
	}
}

// checkKind fills a zero field of d's key from d, which panics where the
// value is not of the field's kind.
func checkKind(t *testing.T, d configDefault) {
	t.Helper()
	v := reflect.New(reflect.TypeFor[Config]()).Elem()
	for name := range strings.SplitSeq(strings.ReplaceAll(d.path, "[]", ""), ".") {
		for v.Kind() == reflect.Pointer {
			v.Set(reflect.New(v.Type().Elem()))
			v = v.Elem()
		}
		if v.Kind() == reflect.Slice {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			v = v.Index(0)
		}
		idx, ok := yamlIndex(v.Type(), name)
		if !ok {
			t.Fatalf("row %s: no key %s", d.path, name)
		}
		v = v.FieldByIndex(idx)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("row %s: value %v (%T) does not fit the key's %s: %v", d.path, d.value, d.value, v.Type(), r)
		}
	}()
	d.fill(v)
}

// A file that gives nothing it may leave out is filled with every default
// the table says the gateway applies.
func TestLoadFillsTheTablesDefaults(t *testing.T) {
	c, err := Parse([]byte(`
models: [{name: m, geometry: {layers: 1, kv_heads: 1, head_dim: 64}, weights_bytes: 1GiB}]
backends: [{name: b, url: "https://127.0.0.1:1", models: [m], kv_budget: 1GiB, tls: {}, health: {}}]
server: {cors: {allowed_origins: ["*"]}}
`), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := reflect.ValueOf(c).Elem()
	for _, d := range configDefaults {
		if d.value == nil || d.by != "" {
			continue
		}
		f, ok := firstAt(root, d.path)
		if !ok {
			t.Errorf("%s: not reached", d.path)
			continue
		}
		for f.Kind() == reflect.Pointer {
			f = f.Elem()
		}
		var got any = f.Interface()
		switch x := got.(type) {
		case Duration:
			got = x.D
		case Size:
			got = byteSize(x.Bytes)
		}
		if want := reflect.ValueOf(d.value).Convert(reflect.TypeOf(got)).Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: loaded %v, the table's default is %v", d.path, got, want)
		}
	}
	if got, want := c.Server.WriteTimeout.D, c.Server.RequestTimeout.D+defaultWriteSlack; got != want {
		t.Errorf("server.write_timeout: %v, want request_timeout + %v = %v", got, defaultWriteSlack, want)
	}
}

// firstAt is the field at path, in the first entry of each list on the way.
func firstAt(v reflect.Value, path string) (reflect.Value, bool) {
	for part := range strings.SplitSeq(path, "[].") {
		if v.Kind() == reflect.Slice {
			if v.Len() == 0 {
				return reflect.Value{}, false
			}
			v = v.Index(0)
		}
		var ok bool
		if v, ok = fieldAt(v, part); !ok {
			return v, false
		}
	}
	return v, true
}

// readmeDefaults is the default column of the README's configuration
// reference, by key: a row of `tls.cert_file`, `tls.key_file` gives both.
func readmeDefaults(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, ref, ok := strings.Cut(string(data), "\n## Configuration reference\n")
	if !ok {
		t.Fatal("README: no Configuration reference")
	}
	ref, _, _ = strings.Cut(ref, "\n## ")
	quoted := regexp.MustCompile("`([^`]+)`")
	cells := map[string]string{}
	section, inSection, inTable := "", false, false
	for line := range strings.SplitSeq(ref, "\n") {
		switch {
		case strings.HasPrefix(line, "### "):
			section, inSection = "", line == "### Top level"
			if m := quoted.FindStringSubmatch(strings.TrimPrefix(line, "### ")); m != nil && strings.HasPrefix(line, "### `") {
				section, inSection = m[1], true
			}
			inTable = false
		case line == "| key | default | meaning |":
			inTable = inSection
		case inTable && strings.HasPrefix(line, "| `"):
			col := strings.Split(line, "|") // "", key, default, meaning...
			for _, m := range quoted.FindAllStringSubmatch(col[1], -1) {
				cells[join(section, m[1])] = strings.TrimSpace(col[2])
			}
		case !strings.HasPrefix(line, "|"):
			inTable = false
		}
	}
	return cells
}

// The README's configuration reference has a row for every row of the
// table, showing the same default, and no row the table lacks.
func TestREADMEShowsEveryDefault(t *testing.T) {
	cells := readmeDefaults(t)
	if len(cells) < 100 {
		t.Fatalf("README: read %d rows of the configuration reference, want them all", len(cells))
	}
	for _, d := range configDefaults {
		cell, ok := cells[d.path]
		if !ok {
			t.Errorf("README: no row for %s (default %s)", d.path, d.want())
			continue
		}
		if !d.shows(cell) {
			t.Errorf("README: %s's default is %q, the table's %s", d.path, cell, d.want())
		}
	}
	for key := range cells {
		if !slices.ContainsFunc(configDefaults, func(d configDefault) bool { return d.covers(key) }) {
			t.Errorf("README: row %s is no key of the table", key)
		}
	}
}

// want is the default as the README should show it.
func (d configDefault) want() string {
	switch {
	case strings.Contains(d.shown, "%s"):
		return fmt.Sprintf(d.shown, shownValue(d.value))
	case d.shown != "" || d.value == nil:
		return d.shown
	}
	return "`" + shownValue(d.value) + "`"
}

// shows says whether a README cell shows d's default: the same text, or,
// for a value, the same value however written (60s or 1m).
func (d configDefault) shows(cell string) bool {
	if d.shown != "" || d.value == nil || !strings.HasPrefix(cell, "`") {
		return cell == d.want()
	}
	if v, ok := d.value.([]string); ok {
		// `[/a, /b]`, `A, B` or `A`, `B` (and a remark in brackets)
		text, _, _ := strings.Cut(cell, " (")
		text = strings.NewReplacer("`", "", "[", "", "]", "").Replace(text)
		return slices.Equal(strings.Split(text, ", "), v)
	}
	return valueIs(strings.Trim(cell, "`"), d.value)
}

// valueIs says whether text, as a file would write it, is value.
func valueIs(text string, value any) bool {
	switch v := value.(type) {
	case time.Duration:
		got, err := time.ParseDuration(text)
		return err == nil && got == v
	case byteSize:
		var s Size
		return s.UnmarshalText([]byte(text)) == nil && byteSize(s.Bytes) == v
	case float64:
		got, err := strconv.ParseFloat(text, 64)
		return err == nil && got == v
	case int:
		got, err := strconv.Atoi(text)
		return err == nil && got == v
	case bool:
		got, err := strconv.ParseBool(text)
		return err == nil && got == v
	}
	return text == fmt.Sprint(value)
}

// The doc comment of a config field that says its default ("Default 30s",
// "default /health") says the table's.
func TestFieldCommentsSayTheTablesDefault(t *testing.T) {
	comments := fieldComments(t)
	// A sentence of its own (Default 32.), else a clause (; default 3).
	said := []*regexp.Regexp{regexp.MustCompile(`\bDefault ([^\s;,(]+)`), regexp.MustCompile(`\bdefault ([^\s;,(]+)`)}
	checked := 0
	var walk func(rt reflect.Type, path string)
	walk = func(rt reflect.Type, path string) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			if rt.Kind() == reflect.Slice {
				path += "[]"
			}
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || rt.PkgPath() != reflect.TypeFor[Config]().PkgPath() {
			return
		}
		for i := range rt.NumField() {
			sf := rt.Field(i)
			name := yamlName(sf)
			if name == "" || isInline(sf) {
				continue
			}
			p := join(path, name)
			walk(sf.Type, p)
			d, ok := defaultsIndex[p]
			if !ok || d.value == nil {
				continue
			}
			if _, list := d.value.([]string); list {
				continue // a list's default is said in prose
			}
			var m []string
			for _, re := range said {
				if all := re.FindAllStringSubmatch(comments[rt.Name()+"."+sf.Name], -1); m == nil && all != nil {
					m = all[len(all)-1]
				}
			}
			if m == nil {
				continue
			}
			checked++
			if word := strings.TrimRight(m[1], ".:"); !valueIs(word, d.value) {
				t.Errorf("%s.%s (%s): its comment says default %q, the table %s", rt.Name(), sf.Name, p, word, shownValue(d.value))
			}
		}
	}
	walk(reflect.TypeFor[Config](), "")
	if checked < 50 {
		t.Fatalf("checked the comments of %d fields, want the defaults of most", checked)
	}
}

// fieldComments is the doc and line comments of every struct field of the
// package, by Type.Field, on one line.
func fieldComments(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				for _, fl := range st.Fields.List {
					text := strings.Join(strings.Fields(fl.Doc.Text()+" "+fl.Comment.Text()), " ")
					for _, id := range fl.Names {
						out[ts.Name.Name+"."+id.Name] = text
					}
				}
			}
			return false
		})
	}
	return out
}
