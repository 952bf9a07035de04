package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func budgetCapacity(t *testing.T, url string) int64 {
	resp, err := http.Get(url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		GPUs []struct {
			Capacity int64 `json:"capacity_bytes"`
		} `json:"gpus"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.GPUs) != 1 {
		t.Fatalf("status: %v %+v", err, st)
	}
	return st.GPUs[0].Capacity
}

// kvgate serve --config: SIGHUP reloads the file (a good one takes effect, a
// broken one is refused and the old stays); SIGTERM finishes the stream in
// flight before exiting 0.
func TestServeReloadAndGracefulShutdown(t *testing.T) {
	s, err := sim.New(sim.Config{TimeScale: 0.1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(sln)
	defer s.Shutdown(context.Background())

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "kvgate.yaml")
	userinfo := ""
	write := func(ceiling string) {
		y := fmt.Sprintf(`admission: {ceiling: %s}
server: {drain_delay: 50ms}
models:
  - {name: llama-3-8b, config: %s, max_model_len: 8192}
backends:
  - {name: gpu0, url: 'http://%s%s', models: [llama-3-8b], gpu_memory: 24GiB}
`, ceiling, filepath.Join(mustAbs(t, "../../examples"), "llama-3-8b.json"), userinfo, sln.Addr())
		if err := os.WriteFile(cfgPath, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("0.75")
	ctx, stop := context.WithCancel(context.Background())
	var stdout, stderr syncbuf.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfgPath, "--listen", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	addrRe := regexp.MustCompile(`kvgate listening" addr=(\S+)`)
	waitFor(t, "the gateway to listen", func() bool { return addrRe.MatchString(stderr.String()) })
	url := "http://" + addrRe.FindStringSubmatch(stderr.String())[1]
	if c := budgetCapacity(t, url); c != 2193088512 {
		t.Fatalf("capacity %d", c)
	}

	write("0.8")
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "the reload", func() bool { return budgetCapacity(t, url) == 3481578700 })

	write("1.7")
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "the refusal to be logged", func() bool { return strings.Contains(stderr.String(), "reload refused") })
	if c := budgetCapacity(t, url); c != 3481578700 {
		t.Fatalf("a refused reload changed the capacity to %d", c)
	}
	if !strings.Contains(stderr.String(), "admission.ceiling") {
		t.Errorf("the refusal does not name the field:\n%s", stderr.String())
	}

	// A url with credentials is refused on reload, as at start, and its
	// password reaches neither the log nor /status.
	const password = "backendPW987"
	userinfo = "backenduser:" + password + "@"
	write("0.8")
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "the second refusal", func() bool { return strings.Count(stderr.String(), "reload refused") == 2 })
	if !strings.Contains(stderr.String(), "backends[0].url: holds credentials") || strings.Contains(stderr.String(), password) {
		t.Errorf("the refusal of a url with credentials:\n%s", stderr.String())
	}
	if st := get(t, url+"/status"); strings.Contains(st, password) || !strings.Contains(st, sln.Addr().String()) {
		t.Errorf("/status after the refusal: %s", st)
	}
	for _, args := range [][]string{{"serve", "--check-config", "--config", cfgPath}, {"serve", "--check-config", "--json", "--config", cfgPath}, {"serve", "--config", cfgPath}} {
		code, out, errOut := runCLI(t, args...)
		if code != exitUsage || !strings.Contains(errOut, "backends[0].url: holds credentials") || !strings.Contains(errOut, "api_key") || strings.Contains(out+errOut, password) {
			t.Errorf("%v: exit %d: %s%s", args, code, out, errOut)
		}
	}

	// A stream in flight when SIGTERM arrives is finished, not cut.
	body := `{"model":"llama-3-8b","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	stop() // what SIGTERM does through signal.NotifyContext in main
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) {
		t.Fatalf("stream cut by shutdown: %v\n%s", err, got)
	}
	select {
	case code := <-exited:
		if code != exitOK {
			t.Fatalf("exit %d\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after shutdown")
	}
	// The log states the drain timeout that applies (the default here),
	// not the unset field's zero.
	if !strings.Contains(stderr.String(), "shutdown_timeout=30s") || strings.Count(stderr.String(), "shutting down") != 1 || !strings.Contains(stderr.String(), "msg=stopped") {
		t.Errorf("the shutdown log does not state the real drain timeout:\n%s", stderr.String())
	}
}

func TestServeBadConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.yaml")
	os.WriteFile(p, []byte("admission: {ceiling: 3}\n"), 0o644)
	code, _, errOut := runCLI(t, "serve", "--config", p)
	if code != exitUsage || !strings.Contains(errOut, "admission.ceiling") || !strings.Contains(errOut, "models: at least one model") {
		t.Errorf("exit %d: %s", code, errOut)
	}
	code, _, errOut = runCLI(t, "serve", "--config", filepath.Join(dir, "missing.yaml"))
	if code != exitUsage || !strings.Contains(errOut, "no such file") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// get is the body of a GET of url.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The demo's --cors-origin lets a browser page call it: a preflight from
// that origin is granted. With a config the flag is refused, naming the
// field to set instead.
func TestDemoCORSOrigin(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	var stdout, stderr syncbuf.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--demo-sim-listen", "127.0.0.1:0",
			"--cors-origin", "http://localhost:5173, https://app.example.com"}, &stdout, &stderr)
	}()
	addrRe := regexp.MustCompile(`kvgate listening" addr=(\S+)`)
	waitFor(t, "the demo to listen", func() bool { return addrRe.MatchString(stderr.String()) })
	url := "http://" + addrRe.FindStringSubmatch(stderr.String())[1]
	req, _ := http.NewRequest(http.MethodOptions, url+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "https://app.example.com")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "content-type")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Errorf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	stop()
	<-exited

	if code, _, errOut := runCLI(t, "serve", "--config", "../../examples/kvgate.yaml", "--cors-origin", "https://a.example"); code != exitUsage ||
		!strings.Contains(errOut, "server.cors.allowed_origins") {
		t.Errorf("with --config: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "serve", "--demo-sim-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--cors-origin", "app.example"); code != exitUsage ||
		!strings.Contains(errOut, "--cors-origin") || !strings.Contains(errOut, "is not an origin") {
		t.Errorf("a bad origin: exit %d: %s", code, errOut)
	}
}
