package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testcerts"
)

// TestHealthTLS: kvgate health probes a gateway that serves TLS and asks
// for client certificates, given the CA and a certificate; without them
// it reports the gateway unreachable.
func TestHealthTLS(t *testing.T) {
	dir := t.TempDir()
	ca, clients := testcerts.NewCA(t, "gateway CA"), testcerts.NewCA(t, "client CA")
	ca.Server(t, "gateway").Write(t, dir, "gateway") // named relative to dir in the config
	clientCert, clientKey := clients.Client(t, "probe").Write(t, dir, "probe")
	caFile, clientCAFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "clients.pem")
	testcerts.WriteFile(t, caFile, ca.CertPEM)
	testcerts.WriteFile(t, clientCAFile, clients.CertPEM)

	addr, _ := startStackWith(t, "server:\n  tls: {cert_file: gateway.crt, key_file: gateway.key, client_ca_file: clients.pem}\n", dir)
	url := "https://" + addr

	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout when ready, else in stderr
	}{
		{"CA and client certificate", []string{"--ca-file", caFile, "--cert-file", clientCert, "--key-file", clientKey}, exitOK, "ready"},
		{"insecure, client certificate", []string{"--insecure-skip-verify", "--cert-file", clientCert, "--key-file", clientKey}, exitOK, "ready"},
		{"system roots", []string{"--cert-file", clientCert, "--key-file", clientKey}, exitNo, "certificate signed by unknown authority"},
		// The refusal reaches the probe as an alert or, if the gateway's
		// close overtakes it, as a closed connection: the exit code says it.
		{"no client certificate", []string{"--ca-file", caFile}, exitNo, url + "/readyz: "},
		{"cert without key", []string{"--cert-file", clientCert}, exitUsage, "--cert-file and --key-file go together"},
		{"CA file not PEM", []string{"--ca-file", clientKey}, exitUsage, "--ca-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"health", "--url", url}, tt.args...)...)
			got := errOut
			if tt.code == exitOK {
				got = out
			}
			if code != tt.code || !strings.Contains(got, tt.want) {
				t.Fatalf("exit %d (want %d), %q not in: %s%s", code, tt.code, tt.want, out, errOut)
			}
		})
	}
}
