package benchkit

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Metrics is one scrape of a Prometheus text page: each series, name and
// labels as written, to its value.
type Metrics map[string]float64

// Scrape reads url (a /metrics page).
func Scrape(ctx context.Context, c *http.Client, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	m := Metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m, sc.Err()
}

// Value is the first series of the metric name whose labels contain each
// of want, and whether there is one: a metric a page lacks is not a zero.
func (m Metrics) Value(name string, want ...string) (float64, bool) {
	for k, v := range m {
		if m.matches(k, name, want) {
			return v, true
		}
	}
	return 0, false
}

// Sum adds every series of the metric name whose labels contain each of
// want (`reason="no_backend"`).
func (m Metrics) Sum(name string, want ...string) float64 {
	var t float64
	for k, v := range m {
		if m.matches(k, name, want) {
			t += v
		}
	}
	return t
}

// matches says whether the series k is of the metric name and its labels
// contain each of want.
func (Metrics) matches(k, name string, want []string) bool {
	if k != name && !strings.HasPrefix(k, name+"{") {
		return false
	}
	for _, w := range want {
		if !strings.Contains(k, w) {
			return false
		}
	}
	return true
}
