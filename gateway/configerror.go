package gateway

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yamlSyntaxError turns the YAML parser's error into one an operator can
// act on: the parser says "yaml: line 4: did not find expected key", which
// names neither what is on line 4 nor the usual cause. The error keeps the
// parser's own words, shows the line, and adds a hint where the message has
// a common cause. A line that may hold a secret (a key, a password, a URL
// with credentials) is not shown: config errors reach logs.
func yamlSyntaxError(data []byte, err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		// Decoding errors (a key twice in one mapping, say): one per line.
		var errs []error
		for _, e := range te.Errors {
			errs = append(errs, describeYAMLProblem(data, e))
		}
		return fmt.Errorf("yaml: %w", errors.Join(errs...))
	}
	return fmt.Errorf("yaml: %w", describeYAMLProblem(data, strings.TrimPrefix(err.Error(), "yaml: ")))
}

var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

func describeYAMLProblem(data []byte, msg string) error {
	lines := strings.Split(string(data), "\n")
	n := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	n = locate(lines, n, msg)
	hint := yamlHint(lines, n, msg)
	var b strings.Builder
	if n > 0 {
		fmt.Fprintf(&b, "line %d: ", n)
	}
	b.WriteString(msg)
	if n > 0 && n <= len(lines) {
		fmt.Fprintf(&b, "\n  %d | %s", n, showLine(lines[n-1]))
	}
	if hint != "" {
		b.WriteString("\n  hint: " + hint)
	}
	return errors.New(b.String())
}

// locate corrects the line the parser gave, or finds one it did not give:
// an unclosed [list] or {mapping} is reported where the parser gave up
// (often the line before, or none), not where the bracket opened; "mapping
// values are not allowed" comes without a line, and is the first plain
// value holding ": ".
func locate(lines []string, n int, msg string) int {
	// The parser names the line before a tab that breaks the indentation:
	// the tab's own line is the first from there indented with one.
	if strings.Contains(msg, "tab character") || strings.Contains(msg, "cannot start any token") {
		for i := max(n, 1) - 1; i < len(lines); i++ {
			indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " \t"))]
			if strings.Contains(indent, "\t") {
				return i + 1
			}
		}
	}
	for _, br := range []struct{ open, close string }{{"[", "]"}, {"{", "}"}} {
		if !strings.Contains(msg, "expected ',' or '"+br.close+"'") {
			continue
		}
		first := 0
		for i := max(n, 1) - 1; i < len(lines); i++ {
			if strings.Count(lines[i], br.open) > strings.Count(lines[i], br.close) {
				return i + 1
			}
			if first == 0 && strings.Contains(lines[i], br.open) {
				first = i + 1
			}
		}
		if n == 0 {
			return first // closed, but broken inside
		}
		return n
	}
	if n != 0 || !strings.Contains(msg, "mapping values are not allowed") {
		return n
	}
	for i, l := range lines {
		l = strings.TrimLeft(strings.TrimSpace(l), "- ")
		if strings.HasPrefix(l, "#") {
			continue
		}
		_, v, ok := strings.Cut(l, ": ")
		v = strings.TrimSpace(v)
		if ok && v != "" && !strings.ContainsAny(v[:1], `"'{[|>#`) && strings.Contains(v, ": ") {
			return i + 1
		}
	}
	return 0
}

// yamlHint names the usual cause of a parser message, looking at the line
// where that helps (the parser reports a missing key where a line's
// indentation went wrong, one line late).
func yamlHint(lines []string, n int, msg string) string {
	line := func(i int) string {
		if i < 1 || i > len(lines) {
			return ""
		}
		return lines[i-1]
	}
	switch {
	case strings.Contains(line(n), "\t") || strings.Contains(line(n-1), "\t") ||
		strings.Contains(msg, "found character that cannot start any token") && strings.Contains(strings.Join(lines, "\n"), "\t"):
		return "YAML does not allow tabs for indentation; indent with spaces"
	case strings.Contains(msg, "mapping values are not allowed"):
		return `a value that holds ": " must be quoted ("like: this")`
	case strings.Contains(msg, "did not find expected key"), strings.Contains(msg, "did not find expected '-' indicator"):
		return "check this line's indentation against the lines above it: keys of one mapping line up, and a list's items too"
	case strings.Contains(msg, "could not find expected ':'"):
		return `a key needs a colon and a space after it ("key: value")`
	case strings.Contains(msg, "found unexpected end of stream"):
		return "a quoted string, [list] or {mapping} is not closed"
	case strings.Contains(msg, "did not find expected ',' or ']'"):
		return "a [list] is not closed, or an item in it holds an unquoted ',' or ':'"
	case strings.Contains(msg, "did not find expected ',' or '}'"):
		return "a {mapping} is not closed, or a value in it holds an unquoted ',' or ':'"
	case strings.Contains(msg, "already defined"):
		return "a key appears twice in one mapping; remove one of them"
	case strings.Contains(msg, "found undefined alias"):
		return "a value starting with * is an alias; quote it if it is meant as text"
	}
	return ""
}

// mayHoldSecret matches lines not to repeat in an error: API keys,
// passwords and tokens, and URLs that carry credentials.
var mayHoldSecret = regexp.MustCompile(`(?i)key|secret|passw|token|://[^/\s]*@`)

func showLine(l string) string {
	if mayHoldSecret.MatchString(l) {
		return "[not shown: the line may hold a secret]"
	}
	return strings.ReplaceAll(l, "\t", "→")
}
