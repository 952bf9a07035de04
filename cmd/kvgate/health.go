package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// runHealth is the container's HEALTHCHECK: a distroless image has no
// curl or shell, so the binary probes itself. It exits 0 when the
// gateway's /readyz answers 200 (a backend can take requests), 1 when it
// answers anything else or cannot be reached, 2 on a bad flag.
func runHealth(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("health", "[--url http://127.0.0.1:8080/readyz] [--timeout 3s]", stdout, stderr)
	target := fs.String("url", "http://127.0.0.1:8080/readyz", "the gateway's readiness URL; a URL without a path gets /readyz")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	u, err := url.Parse(*target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fail(stderr, "health", exitUsage, "--url %q: want http://host:port[/path]", *target)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/readyz"
	}
	if *timeout <= 0 {
		return fail(stderr, "health", exitUsage, "--timeout must be positive, got %s", *timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fail(stderr, "health", exitUsage, "--url: %v", err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return fail(stderr, "health", exitNo, "%s: %v", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return fail(stderr, "health", exitNo, "%s: not ready: HTTP %d %s", u, resp.StatusCode, msg)
	}
	fmt.Fprintf(stdout, "%s: ready\n", u)
	return exitOK
}
