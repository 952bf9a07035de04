//go:build unix

package main

import (
	"context"
	"encoding/json"
	"html/template"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

// browserCall is what the test page reports of its cross-origin fetch.
type browserCall struct {
	OK        bool   `json:"ok"`
	Status    int    `json:"status"`
	RequestID string `json:"request_id"` // the answer's X-Request-Id, as the page could read it
	Content   string `json:"content"`
	Error     string `json:"error"`
}

// corsPage is served from one loopback origin and calls the gateway on
// another. Its X-Request-Id header and JSON body make the browser send a
// preflight first; what comes of the fetch is posted back to the page's
// own origin, which needs no CORS.
var corsPage = template.Must(template.New("page").Parse(`<!doctype html>
<title>kvgate CORS</title>
<script>
(async () => {
  let r;
  try {
    const resp = await fetch({{.Gateway}} + "/v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "X-Request-Id": "browser-preflight-1"},
      body: JSON.stringify({model: "llama-3-8b", max_tokens: 3, messages: [{role: "user", content: "hi"}]}),
    });
    const body = await resp.json();
    r = {ok: resp.ok, status: resp.status, request_id: resp.headers.get("X-Request-Id") || "",
      content: body.choices ? body.choices[0].message.content : JSON.stringify(body)};
  } catch (e) {
    r = {ok: false, error: String(e)};
  }
  await fetch("/report", {method: "POST", body: JSON.stringify(r)});
})();
</script>
`))

// postLogged matches the access line of the page's POST.
var postLogged = regexp.MustCompile(`msg=request id=browser-preflight-1 method=POST route=/v1/chat/completions`)

// chromium is Debian's chromium. CI installs it (.ci/run), so there a
// missing one fails the test; elsewhere the test is skipped.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("Chromium is not installed under CI, which must install it (.ci/run)")
	}
	t.Skip("Chromium is not installed (Debian: apt-get install -y chromium); skipping the browser's CORS preflight")
	return ""
}

// TestDemoCORSInHeadlessChromium: a page on one loopback origin calls the
// demo gateway on another with a preflighted fetch, in a real browser. The
// call succeeds when --cors-origin names the page's origin (the page reads
// the answer and its exposed X-Request-Id), and the browser blocks it
// without the flag or when the flag names another origin.
func TestDemoCORSInHeadlessChromium(t *testing.T) {
	browser := chromium(t)
	tests := []struct {
		name   string
		origin func(page string) string // --cors-origin; "" for none
		ok     bool
	}{
		{"the page's origin allowed", func(page string) string { return page }, true},
		{"no --cors-origin", func(string) string { return "" }, false},
		{"another origin allowed", func(string) string { return "http://localhost:5173" }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reports := make(chan browserCall, 1)
			var gateway string
			// Unstarted, so that its origin is known for --cors-origin and
			// the gateway's address is set before it serves.
			page := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/":
					w.Header().Set("Content-Type", "text/html; charset=utf-8")
					corsPage.Execute(w, struct{ Gateway string }{gateway})
				case "/report":
					var c browserCall
					if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
						c.Error = "the page's report: " + err.Error()
					}
					select {
					case reports <- c:
					default:
					}
				default:
					http.NotFound(w, r)
				}
			}))
			defer page.Close()
			pageOrigin := "http://" + page.Listener.Addr().String()

			args := []string{"serve", "--listen", "127.0.0.1:0", "--demo-sim-listen", "127.0.0.1:0"}
			if o := tc.origin(pageOrigin); o != "" {
				args = append(args, "--cors-origin", o)
			}
			ctx, stop := context.WithCancel(context.Background())
			var stderr syncbuf.Buffer
			exited := make(chan int, 1)
			go func() { exited <- run(ctx, args, &syncbuf.Buffer{}, &stderr) }()
			defer func() { stop(); <-exited }()
			addrRe := regexp.MustCompile(`kvgate listening" addr=(\S+)`)
			waitFor(t, "the demo to listen", func() bool { return addrRe.MatchString(stderr.String()) })
			gateway = "http://" + addrRe.FindStringSubmatch(stderr.String())[1]
			page.Start()

			c := runChromium(t, browser, page.URL+"/", reports)
			if c.OK != tc.ok {
				t.Fatalf("the page's fetch: %+v; want ok %v", c, tc.ok)
			}
			if tc.ok && (c.Status != 200 || c.RequestID != "browser-preflight-1" || c.Content == "") {
				t.Errorf("allowed: %+v; want 200 with its X-Request-Id readable and an answer", c)
			}
			// The access line of the POST shows whether the browser sent it:
			// refused at the preflight, it never does.
			sent := func() bool { return postLogged.MatchString(stderr.String()) }
			if tc.ok {
				waitFor(t, "the POST's access line", sent)
			}
			if !tc.ok && (c.Status != 0 || c.Error == "" || sent()) {
				t.Errorf("refused: %+v, POST sent %v; want the browser to block it at the preflight (a TypeError, no status, no POST)", c, sent())
			}
		})
	}
}

// runChromium opens url in headless Chromium until the page reports, and
// kills the browser (its whole process group) then.
func runChromium(t *testing.T, browser, url string, reports <-chan browserCall) browserCall {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(t.TempDir(), "profile"), url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var c browserCall
	select {
	case c = <-reports:
	case err := <-done:
		t.Fatalf("chromium exited before the page reported: %v\n%s", err, out.String())
	case <-ctx.Done():
		t.Fatalf("the page did not report in time\nchromium: %s", out.String())
	}
	cancel()
	<-done
	t.Logf("the page reported %+v", c)
	return c
}
