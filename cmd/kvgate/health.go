package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/backends"
)

// runHealth is the container's HEALTHCHECK: a distroless image has no
// curl or shell, so the binary probes itself. It exits 0 when the
// gateway's /readyz answers 200 (a backend can take requests), 1 when it
// answers anything else or cannot be reached, 2 on a bad flag.
func runHealth(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("health", "[--url http://127.0.0.1:8080/readyz] [--timeout 3s] [--ca-file F] [--cert-file F --key-file F] [--insecure-skip-verify]", stdout, stderr)
	target := fs.String("url", "http://127.0.0.1:8080/readyz", "the gateway's readiness URL; a URL without a path gets /readyz")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	caFile := fs.String("ca-file", "", "https: PEM certificates that sign the gateway's (default: the system's roots)")
	certFile := fs.String("cert-file", "", "https: client certificate (PEM), for a gateway with server.tls.client_ca_file; with --key-file")
	keyFile := fs.String("key-file", "", "https: the client certificate's key (PEM)")
	insecure := fs.Bool("insecure-skip-verify", false, "https: accept any certificate the gateway shows (it probes itself, on loopback)")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	tlsCfg, err := healthTLS(*caFile, *certFile, *keyFile, *insecure)
	if err != nil {
		return fail(stderr, "health", exitUsage, "%v", err)
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
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Transport: tr}
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

// healthTLS is the probe's TLS client configuration from its flags.
func healthTLS(caFile, certFile, keyFile string, insecure bool) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure} //nolint:gosec // opt-in
	if caFile != "" {
		data, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		if c.RootCAs, err = backends.ParseCertPool(data); err != nil {
			return nil, fmt.Errorf("--ca-file %s: %w", caFile, err)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--cert-file and --key-file go together")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert-file, --key-file: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
