package gateway

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// One pass over a config: the shape's problems (unknown keys, values of
// the wrong kind), found on the YAML tree, and the values' (out of range,
// missing, a file that cannot be read), found on what decoded, are reported
// together, each with the line it is on, in the file's order. A field the
// shape refused is not checked again as a value: it decoded as its zero,
// and "required" would only repeat the first complaint.

// keyLines maps a field's path (backends[0].url) to the line it is on.
type keyLines map[string]int

func indexLines(doc *yaml.Node) keyLines {
	lines := keyLines{}
	if doc == nil || doc.Kind == 0 {
		return lines
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return lines
		}
		doc = doc.Content[0]
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := join(path, n.Content[i].Value)
				lines[p] = n.Content[i].Line
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, item := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				lines[p] = item.Line
				walk(item, p)
			}
		}
	}
	walk(doc, "")
	return lines
}

// lineOf is the line of path, or of its nearest ancestor in the file (a
// required key that is missing is reported where its section is); 0 if
// none is.
func (k keyLines) lineOf(path string) int {
	for p := path; p != ""; {
		if n, ok := k[p]; ok {
			return n
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

// fieldPrefix reads the field path a problem starts with ("backends[0].url:
// required" names backends[0].url).
var fieldPrefix = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_-]*(?:\[\d+\])*(?:\.[^:\s.\[]+(?:\[\d+\])*)*): `)

// located is one problem, with its field and line.
type located struct {
	field string
	line  int
	err   error
}

var lineSuffix = regexp.MustCompile(`\(line (\d+)\)`)

// locate splits a joined error into its problems and gives each its line,
// from its text when the shape check wrote one, else from its field.
func (k keyLines) locate(err error) []located {
	if err == nil {
		return nil
	}
	var out []located
	var each func(e error)
	each = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				each(e)
			}
			return
		}
		msg := e.Error()
		l := located{err: e}
		if m := fieldPrefix.FindStringSubmatch(msg); m != nil {
			l.field = m[1]
		}
		if m := lineSuffix.FindStringSubmatch(msg); m != nil {
			fmt.Sscan(m[1], &l.line)
		} else if l.line = k.lineOf(l.field); l.line > 0 {
			first, rest, _ := strings.Cut(msg, "\n")
			msg = fmt.Sprintf("%s (line %d)", first, l.line)
			if rest != "" {
				msg += "\n" + rest
			}
			l.err = errors.New(msg)
		}
		out = append(out, l)
	}
	each(err)
	return out
}

// onePass joins the shape's problems and the values' in the file's order,
// dropping a value's problem on a field the shape refused (or inside one).
func (k keyLines) onePass(shape, values error) error {
	ps := k.locate(shape)
	for _, v := range k.locate(values) {
		refused := slices.ContainsFunc(ps, func(s located) bool {
			return s.field != "" && (v.field == s.field || strings.HasPrefix(v.field, s.field+".") || strings.HasPrefix(v.field, s.field+"["))
		})
		if !refused {
			ps = append(ps, v)
		}
	}
	if len(ps) == 0 {
		return nil
	}
	// In the file's order; a problem of no line (the file as a whole)
	// last.
	slices.SortStableFunc(ps, func(a, b located) int {
		switch {
		case a.line == b.line:
			return 0
		case a.line == 0:
			return 1
		case b.line == 0:
			return -1
		}
		return a.line - b.line
	})
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p.err
	}
	return errors.Join(errs...)
}
