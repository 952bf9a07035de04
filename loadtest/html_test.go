package loadtest

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func htmlOf(t *testing.T, r *Report) string {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteHTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestHTMLIsSelfContained(t *testing.T) {
	rep := fakeRun(t, nil)
	page := htmlOf(t, rep)
	if n := strings.Count(page, "<svg "); n != 6 {
		t.Errorf("%d plots, want 6 (tok/s, req/s, p99 TTFT, p99 e2e, peak KV, memory curve)", n)
	}
	// Nothing to fetch: no script, no stylesheet or image link, no CSS url().
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<script`), regexp.MustCompile(`(?i)\ssrc\s*=`), regexp.MustCompile(`(?i)<link`),
		regexp.MustCompile(`(?i)url\(`), regexp.MustCompile(`(?i)@import`), regexp.MustCompile(`(?i)\shref\s*=`),
	} {
		if loc := bad.FindStringIndex(page); loc != nil {
			t.Errorf("report loads something: %q", page[max(loc[0]-40, 0):min(loc[1]+40, len(page))])
		}
	}
	// The memory curve says how often it was sampled (the fake run's 10 ms).
	for _, want := range []string{"KV limit 75%", "safe: 4 (fake)", "Safe concurrency for fake: 4", `class="marker unsafe"`, "<table id=\"steps\">",
		"sampled every 10 ms"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

func TestHTMLEscapes(t *testing.T) {
	rep := fakeRun(t, nil)
	rep.Targets[0].Name = `<img src=x onerror=alert(1)>`
	for i := range rep.Steps {
		rep.Steps[i].Target = rep.Targets[0].Name
	}
	rep.Answer = "safe <b>bold</b>"
	page := htmlOf(t, rep)
	if strings.Contains(page, "<img") || strings.Contains(page, "<b>bold") {
		t.Error("a target name or the answer reached the page unescaped")
	}
	if !strings.Contains(page, "&lt;img src=x") {
		t.Error("escaped name missing")
	}
}

func TestHTMLCompareOverlaysTargets(t *testing.T) {
	a, b := &fakeOpenAI{kvSlots: 8, oomAbove: 5}, &fakeOpenAI{kvSlots: 16, oomAbove: 100}
	cfg := Config{
		Targets:     []Target{{Name: "direct", URL: a.start(t)}, {Name: "gateway", URL: b.start(t)}},
		Concurrency: []int{1, 2, 4, 8}, Requests: 20, Warmup: -1, ScrapeInterval: 10 * time.Millisecond,
		OutputTokens: fixed(4), PromptTokens: fixed(20),
	}
	withGang(&cfg, a, b)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	page := htmlOf(t, rep)
	if strings.Count(page, "<svg ") != 6 || strings.Count(page, `<polyline class="series"`) != 12 {
		t.Errorf("want 6 plots with one line per target each; got %d plots, %d lines",
			strings.Count(page, "<svg "), strings.Count(page, `<polyline class="series"`))
	}
	for _, want := range []string{"safe: 4 (direct)", "safe: 8 (gateway)", `class="legend">direct<`, "<th>target</th>"} {
		if !strings.Contains(page, want) {
			t.Errorf("compare report lacks %q", want)
		}
	}
	if rep.Safe != 4 {
		t.Errorf("top-level safe %g, want the lower of 4 and 8", rep.Safe)
	}
}

// chromiumPath finds Debian's chromium, or the test is skipped.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("Chromium is not installed (Debian: apt-get install -y chromium); skipping the headless render of the HTML report")
	return ""
}

func TestHTMLRendersInHeadlessChromium(t *testing.T) {
	chromium := chromiumPath(t)
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, []byte(htmlOf(t, fakeRun(t, nil))), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "shot.png")
	args := func(extra ...string) []string {
		return append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1200,1600"}, append(extra, "file://"+page)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, chromium, args("--screenshot="+shot)...).CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 1600 {
		t.Errorf("screenshot is %v", b)
	}
	// A rendered report has many colours, and the series blue among them.
	colours, blue := map[uint32]bool{}, 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			colours[(r>>8)<<16|(g>>8)<<8|bl>>8] = true
			if near(float64(r>>8), 0x15, 12) && near(float64(g>>8), 0x65, 12) && near(float64(bl>>8), 0xc0, 12) {
				blue++
			}
		}
	}
	if len(colours) < 50 || blue < 100 {
		t.Errorf("screenshot looks blank: %d colours, %d series-blue pixels", len(colours), blue)
	}

	dom, err := exec.CommandContext(ctx, chromium, args("--dump-dom")...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	d := string(dom)
	if n := strings.Count(d, "<svg "); n != 6 || !strings.Contains(d, "Safe concurrency for fake: 4") || strings.Count(d, "<polyline") < 6 {
		t.Errorf("rendered DOM: %d svg elements, answer present %v", n, strings.Contains(d, "Safe concurrency for fake: 4"))
	}
	for _, bad := range []string{"chrome-error://", "ERR_FILE_NOT_FOUND", "This page isn"} {
		if strings.Contains(d, bad) {
			t.Errorf("rendered DOM shows an error page (%q)", bad)
		}
	}
}

// A priced run reports the cost of every step, of the safe level and of
// the whole run, the same in the table, the CSV, the JSON and the HTML.
func TestCostIsReportedEverywhere(t *testing.T) {
	rep := fakeRun(t, func(c *Config) { c.Targets[0].PricePerHour = 2.5 })
	tr := rep.Targets[0]
	var sum float64
	for i := range rep.Steps {
		s := &rep.Steps[i]
		if s.Cost == nil || s.OutputTokensPerS <= 0 || s.Cost.PerMillionOutputTokens == nil {
			t.Fatalf("step %g: cost %+v at %g tok/s", s.Level, s.Cost, s.OutputTokensPerS)
		}
		if want := 2.5 / (s.OutputTokensPerS * 3600) * 1e6; math.Abs(*s.Cost.PerMillionOutputTokens-want) > 1e-9*want {
			t.Errorf("step %g: %g per million tokens, want %g", s.Level, *s.Cost.PerMillionOutputTokens, want)
		}
		if want := 2.5 * s.WallS / 3600; math.Abs(s.Cost.Run-want) > 1e-12 {
			t.Errorf("step %g: run cost %g, want %g", s.Level, s.Cost.Run, want)
		}
		sum += s.Cost.Run
	}
	if !tr.HasSafe || tr.CostAtSafe == nil || tr.CostAtSafe != tr.step(tr.Safe).Cost || math.Abs(tr.RunCost-sum) > 1e-12 {
		t.Fatalf("target: safe %v, cost at safe %+v, run cost %g (steps sum to %g)", tr.HasSafe, tr.CostAtSafe, tr.RunCost, sum)
	}
	perM := fmtMoney(*tr.CostAtSafe.PerMillionOutputTokens)
	if !strings.Contains(rep.Answer, perM+" per million output tokens") || !strings.Contains(rep.Answer, "At 2.50 an hour the run cost") {
		t.Errorf("answer: %s", rep.Answer)
	}
	var table, csvOut, js bytes.Buffer
	if err := WriteTable(&table, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "cost/Mtok") || !strings.Contains(table.String(), perM) {
		t.Errorf("table lacks the cost:\n%s", table.String())
	}
	if err := WriteCSV(&csvOut, rep); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&csvOut).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := slices.Index(rows[0], "cost_per_million_output_tokens")
	if col < 0 || rows[1][col] == "" || rows[1][slices.Index(rows[0], "price_per_hour")] != "2.5" || rows[1][slices.Index(rows[0], "run_cost")] == "" {
		t.Errorf("CSV: %v / %v", rows[0], rows[1])
	}
	if err := json.NewEncoder(&js).Encode(rep); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Targets []struct {
			Price      float64 `json:"price_per_hour"`
			CostAtSafe struct {
				PerM *float64 `json:"per_million_output_tokens"`
			} `json:"cost_at_safe"`
			RunCost float64 `json:"run_cost"`
		} `json:"targets"`
		Steps []struct {
			Cost *Cost `json:"cost"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if b := back.Targets[0]; b.Price != 2.5 || b.CostAtSafe.PerM == nil || *b.CostAtSafe.PerM != *tr.CostAtSafe.PerMillionOutputTokens || b.RunCost != tr.RunCost || back.Steps[0].Cost == nil {
		t.Errorf("JSON: %s", js.String())
	}
	page := htmlOf(t, rep)
	for _, want := range []string{"<th>cost / M out tok</th>", "<th>run cost</th>", "Cost per million output tokens", "per million output tokens at the safe level"} {
		if !strings.Contains(page, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if n := strings.Count(page, "<svg "); n != 7 {
		t.Errorf("%d plots, want 7 with the cost plot", n)
	}
	// Unpriced: no cost anywhere.
	plain := fakeRun(t, nil)
	table.Reset()
	WriteTable(&table, plain)
	if plain.Steps[0].Cost != nil || strings.Contains(table.String(), "cost") || strings.Contains(htmlOf(t, plain), "run cost") {
		t.Error("an unpriced run shows costs")
	}
}

// The steps table fits a laptop screen: at 1400 px, in Chromium, the page
// does not scroll sideways, even for the widest report (two targets with
// long names, priced, with SLOs and reasons).
func TestHTMLStepsTableFits1400px(t *testing.T) {
	chromium := chromiumPath(t)
	a, b := &fakeOpenAI{kvSlots: 8, oomAbove: 5}, &fakeOpenAI{kvSlots: 16, oomAbove: 100}
	rep, err := Run(t.Context(), Config{
		Targets: []Target{{Name: "direct-a100-80gb", URL: a.start(t), PricePerHour: 2.10},
			{Name: "gateway-a100-80gb", URL: b.start(t), PricePerHour: 2.10}},
		Concurrency: []int{1, 2, 4, 8, 16}, Requests: 20, Warmup: -1, ScrapeInterval: 10 * time.Millisecond,
		OutputTokens: fixed(4), PromptTokens: fixed(20), SLOTTFT: time.Second, SLOE2E: 2 * time.Second, KeepGoing: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	// The report has no script; the test adds one that measures it.
	measure := `<script>
var r = document.getElementById("steps").getBoundingClientRect(), d = document.documentElement;
document.body.setAttribute("data-fit", "right=" + Math.ceil(r.right) + " client=" + d.clientWidth + " scroll=" + d.scrollWidth);
</script></body>`
	report := htmlOf(t, rep)
	// A step's reasons take a row of their own, across every column.
	head := report[strings.Index(report, "<thead>"):strings.Index(report, "</thead>")]
	if want := fmt.Sprintf(`<tr class="why unsafe"><td colspan="%d">`, strings.Count(head, "<th>")); !strings.Contains(report, want) {
		t.Errorf("no reasons row spanning the %d columns (%s)", strings.Count(head, "<th>"), want)
	}
	html := strings.Replace(report, "</body>", measure, 1)
	if err := os.WriteFile(page, []byte(html), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	dom, err := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--window-size=1400,900", "--dump-dom", "file://"+page).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	m := regexp.MustCompile(`data-fit="right=(\d+) client=(\d+) scroll=(\d+)"`).FindStringSubmatch(string(dom))
	if m == nil {
		t.Fatalf("the measuring script did not run:\n%.2000s", dom)
	}
	right, client, scroll := atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3])
	if client != 1400 {
		t.Fatalf("viewport is %d px wide, want 1400", client)
	}
	if right > client || scroll > client {
		t.Errorf("at %d px the steps table ends at %d px and the page is %d px wide: it overflows", client, right, scroll)
	}
	if !strings.Contains(string(dom), "cost / M out tok") {
		t.Error("the measured report has no cost columns")
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Unless told otherwise the memory curve is sampled every 250 ms: a KV
// peak that lasts a few decode steps (tens of ms each) falls between
// one-second samples.
func TestDefaultScrapeIntervalCatchesShortPeaks(t *testing.T) {
	c, err := Config{Targets: []Target{{URL: "http://127.0.0.1:1"}}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.ScrapeInterval != 250*time.Millisecond {
		t.Errorf("default scrape interval %s, want 250ms", c.ScrapeInterval)
	}
}
