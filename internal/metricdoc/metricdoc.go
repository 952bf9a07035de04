package metricdoc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Row is one documented metric family.
type Row struct {
	Name    string
	Type    string   // counter, gauge, histogram, summary
	Labels  []string // sorted; a histogram's le is implied
	Meaning string
}

// ParseFile reads the table that follows the heading containing section
// (e.g. "kvgate serve") in a Markdown file, up to the next heading.
func ParseFile(path, section string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := Parse(f, section)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

// Parse reads the rows of the table under the heading containing section.
// A row is `| `name` | type | label, label | meaning |`; labels "—" or ""
// mean none.
func Parse(r io.Reader, section string) ([]Row, error) {
	sc := bufio.NewScanner(r)
	in := false
	var rows []Row
	seen := map[string]bool{}
	for line := 0; sc.Scan(); {
		line++
		t := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(t, "#") {
			in = strings.Contains(t, section)
			continue
		}
		if !in || !strings.HasPrefix(t, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(t, "|"), "|")
		if len(cells) != 4 {
			return nil, fmt.Errorf("line %d: want 4 cells (name, type, labels, meaning), got %d", line, len(cells))
		}
		row := Row{Name: strings.Trim(strings.TrimSpace(cells[0]), "`"), Type: strings.TrimSpace(cells[1]),
			Meaning: strings.TrimSpace(cells[3])}
		for _, l := range strings.Split(cells[2], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" && l != "—" {
				row.Labels = append(row.Labels, l)
			}
		}
		sort.Strings(row.Labels)
		switch row.Type {
		case "counter", "gauge", "histogram", "summary":
		default:
			return nil, fmt.Errorf("line %d: %s: unknown type %q", line, row.Name, row.Type)
		}
		if row.Meaning == "" {
			return nil, fmt.Errorf("line %d: %s: no meaning", line, row.Name)
		}
		if seen[row.Name] {
			return nil, fmt.Errorf("line %d: %s is listed twice", line, row.Name)
		}
		seen[row.Name] = true
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no metric table under a heading containing %q", section)
	}
	return rows, nil
}

// Scrape fetches and parses a /metrics page.
func Scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return ParseText(resp.Body)
}

// ParseText parses the Prometheus text format.
func ParseText(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// Labels are the label names a family's series carry, sorted (le and
// quantile excluded).
func Labels(f *dto.MetricFamily) []string {
	set := map[string]bool{}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			set[l.GetName()] = true
		}
	}
	out := make([]string, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// Compare lists every difference between the documented rows and the
// scraped families: a family missing from either side, or a different type
// or label set. Families for which skip returns true (the Go runtime's, say)
// are not compared.
func Compare(rows []Row, fams map[string]*dto.MetricFamily, skip func(name string) bool) []string {
	var diffs []string
	doc := map[string]Row{}
	for _, r := range rows {
		doc[r.Name] = r
		f, ok := fams[r.Name]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s is documented but not exported", r.Name))
			continue
		}
		if typ := strings.ToLower(f.GetType().String()); typ != r.Type {
			diffs = append(diffs, fmt.Sprintf("%s: documented as %s, exported as %s", r.Name, r.Type, typ))
		}
		if got := Labels(f); !slices.Equal(got, r.Labels) {
			diffs = append(diffs, fmt.Sprintf("%s: documented labels %v, exported %v", r.Name, r.Labels, got))
		}
	}
	for name := range fams {
		if _, ok := doc[name]; !ok && (skip == nil || !skip(name)) {
			diffs = append(diffs, fmt.Sprintf("%s is exported but not documented", name))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// Lint checks the naming rules on scraped families. compat names families
// whose names are kept as another program spells them (vLLM's vllm:*), which
// are exempt from the naming rules but not from the state rule.
func Lint(fams map[string]*dto.MetricFamily, compat func(name string) bool) []string {
	var probs []string
	own := map[string]*dto.MetricFamily{}
	for name, f := range fams {
		if compat != nil && compat(name) {
			continue
		}
		own[name] = f
		isCounter := f.GetType() == dto.MetricType_COUNTER
		if isCounter != strings.HasSuffix(name, "_total") {
			probs = append(probs, fmt.Sprintf("%s: a %s; counters and only counters end in _total", name, strings.ToLower(f.GetType().String())))
		}
		if strings.Contains(name, ":") {
			probs = append(probs, fmt.Sprintf("%s: colons are for recording rules", name))
		}
		if strings.HasSuffix(name, "_info") && f.GetType() != dto.MetricType_GAUGE {
			probs = append(probs, fmt.Sprintf("%s: an info metric is a gauge", name))
		}
	}
	lint := promlint.NewWithMetricFamilies(familiesOf(own))
	ps, err := lint.Lint()
	if err != nil {
		probs = append(probs, fmt.Sprintf("promlint: %v", err))
	}
	for _, p := range ps {
		probs = append(probs, fmt.Sprintf("%s: %s", p.Metric, p.Text))
	}
	for name, f := range fams {
		probs = append(probs, lintState(name, f)...)
	}
	sort.Strings(probs)
	return probs
}

func familiesOf(m map[string]*dto.MetricFamily) []*dto.MetricFamily {
	out := make([]*dto.MetricFamily, 0, len(m))
	for _, f := range m {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// lintState checks a family with a "state" label: per value of its other
// labels, every series is 0 or 1 and exactly one is 1. A state carried as a
// label whose value changes on a single series breaks rate() and alerting
// on a state, and shows as gaps on a dashboard.
func lintState(name string, f *dto.MetricFamily) []string {
	groups := map[string][]float64{}
	has := false
	for _, m := range f.GetMetric() {
		var key []string
		isState := false
		for _, l := range m.GetLabel() {
			if l.GetName() == "state" {
				isState = true
				continue
			}
			key = append(key, l.GetName()+"="+l.GetValue())
		}
		if !isState {
			continue
		}
		has = true
		if f.GetType() != dto.MetricType_GAUGE {
			return []string{fmt.Sprintf("%s: a state label belongs on a 0/1 gauge", name)}
		}
		k := strings.Join(key, ",")
		groups[k] = append(groups[k], m.GetGauge().GetValue())
	}
	if !has {
		return nil
	}
	var probs []string
	for k, vs := range groups {
		ones := 0
		for _, v := range vs {
			switch v {
			case 1:
				ones++
			case 0:
			default:
				probs = append(probs, fmt.Sprintf("%s{%s}: a state series is %g, not 0 or 1", name, k, v))
			}
		}
		if ones != 1 || len(vs) < 2 {
			probs = append(probs, fmt.Sprintf("%s{%s}: %d state series, %d of them 1: want one series per state, exactly one 1", name, k, len(vs), ones))
		}
	}
	return probs
}
