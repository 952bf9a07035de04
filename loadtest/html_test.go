package loadtest

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	for _, want := range []string{"ceiling 75%", "safe: 4 (fake)", "Safe concurrency for fake: 4", `class="marker unsafe"`, "<table id=\"steps\">"} {
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
