package benchkit

import (
	"bufio"
	"context"
	"fmt"
	"io"
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

// Sum adds every series of the metric name whose labels contain each of
// want (`reason="no_backend"`).
func (m Metrics) Sum(name string, want ...string) float64 {
	var t float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		all := true
		for _, w := range want {
			all = all && strings.Contains(k, w)
		}
		if all {
			t += v
		}
	}
	return t
}

// Check prints one acceptance line, [PASS] or [FAIL], and returns ok.
func Check(w io.Writer, ok bool, format string, a ...any) bool {
	mark := "PASS"
	if !ok {
		mark = "FAIL"
	}
	fmt.Fprintf(w, "  [%s] %s\n", mark, fmt.Sprintf(format, a...))
	return ok
}
