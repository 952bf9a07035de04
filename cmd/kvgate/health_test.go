package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
	"github.com/kvgate/kvgate/gateway"
)

// startStack runs a simulated vLLM and a gateway in front of it on loopback
// ports; stopSim stops the backend alone.
func startStack(t *testing.T) (gwURL string, stopSim func()) {
	t.Helper()
	addr, stopSim := startStackWith(t, "", ".")
	return "http://" + addr, stopSim
}

// startStackWith is startStack with head (YAML before models:, such as a
// server: section) in a config whose relative paths are read from dir; it
// returns the gateway's host:port.
func startStackWith(t *testing.T, head, dir string) (addr string, stopSim func()) {
	t.Helper()
	s, err := sim.New(sim.Config{TimeScale: 0.01, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(sln)
	var once bool
	stopSim = func() {
		if !once {
			once = true
			s.Shutdown(context.Background())
		}
	}
	t.Cleanup(stopSim)
	cfg, err := gateway.Parse([]byte(head+`models:
  - {name: llama-3-8b, geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}, weights_bytes: 16060522496}
backends:
  - name: sim0
    url: http://`+sln.Addr().String()+`
    models: [llama-3-8b]
    gpu_memory: 24GiB
    health: {interval: 20ms, failures: 1, cooldown: 1h}
`), dir)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(cfg, gateway.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(gln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
	})
	return gln.Addr().String(), stopSim
}

func TestHealth(t *testing.T) {
	gwURL, stopSim := startStack(t)
	code, out, errOut := runCLI(t, "health", "--url", gwURL+"/readyz")
	if code != exitOK || !strings.Contains(out, "ready") {
		t.Fatalf("ready gateway: exit %d: %s%s", code, out, errOut)
	}
	// A URL without a path probes /readyz.
	if code, out, _ := runCLI(t, "health", "--url", gwURL); code != exitOK || !strings.Contains(out, "/readyz") {
		t.Fatalf("bare URL: exit %d: %s", code, out)
	}
	// With its only backend gone the gateway is alive but not ready.
	stopSim()
	waitFor(t, "readiness to fail", func() bool { code, _, _ := runCLI(t, "health", "--url", gwURL); return code == exitNo })
	_, _, errOut = runCLI(t, "health", "--url", gwURL)
	if !strings.Contains(errOut, "HTTP 503") || !strings.Contains(errOut, "no_healthy_backend") {
		t.Errorf("not-ready message: %s", errOut)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--url", deadAddr(t)}, exitNo, "connection refused"},
		{[]string{"--url", "ftp://x"}, exitUsage, "--url"},
		{[]string{"--url", "127.0.0.1:8080"}, exitUsage, "--url"},
		{[]string{"--timeout", "0s"}, exitUsage, "--timeout"},
		{[]string{"--bogus"}, exitUsage, "bogus"},
	} {
		code, _, errOut := runCLI(t, append([]string{"health"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, want %d with %q: %s", tc.args, code, tc.code, tc.want, errOut)
		}
	}
}

func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return "http://" + ln.Addr().String()
}

// dockerfile is the repository's Dockerfile, continuation lines joined.
func dockerfile(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		if line := strings.TrimSpace(cur + l); line != "" {
			lines = append(lines, line)
		}
		cur = ""
	}
	return lines
}

func execForm(t *testing.T, instr, rest string) []string {
	t.Helper()
	var args []string
	if err := json.Unmarshal([]byte(rest), &args); err != nil || len(args) == 0 {
		t.Fatalf("%s %s: not the exec form (a distroless image has no shell to run the other)", instr, rest)
	}
	return args
}

// The image's HEALTHCHECK is a command this binary runs, in exec form (no
// shell in the image), probing the port the image's config listens on; run
// against a gateway it says ready, and not ready once the backend is gone.
func TestDockerfileHealthcheck(t *testing.T) {
	var health, entry []string
	var expose, user string
	configs := map[string]string{} // image path → repository path
	for _, l := range dockerfile(t) {
		instr, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(instr) {
		case "HEALTHCHECK":
			i := strings.Index(rest, "CMD ")
			if i < 0 {
				t.Fatalf("HEALTHCHECK without CMD: %s", l)
			}
			health = execForm(t, instr, strings.TrimSpace(rest[i+4:]))
		case "ENTRYPOINT":
			entry = execForm(t, instr, rest)
		case "EXPOSE":
			expose = rest
		case "USER":
			user = rest
		case "COPY":
			if f := strings.Fields(rest); len(f) == 2 {
				configs[f[1]] = f[0]
			}
		}
	}
	if health == nil || entry == nil {
		t.Fatal("the Dockerfile has no HEALTHCHECK or no ENTRYPOINT")
	}
	if health[0] != entry[0] || health[1] != "health" {
		t.Fatalf("HEALTHCHECK %v does not run the image's binary %s health", health, entry[0])
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("USER %q: want a numeric non-root uid", user)
	}
	// The probed port is the exposed one and the one the image's config
	// listens on.
	args := health[2:]
	var probe *url.URL
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--url" {
			probe, _ = url.Parse(args[i+1])
		}
	}
	if probe == nil {
		t.Fatalf("HEALTHCHECK %v names no --url", health)
	}
	if probe.Port() != expose {
		t.Errorf("HEALTHCHECK probes port %s, the image exposes %s", probe.Port(), expose)
	}
	src, ok := configs["/etc/kvgate/kvgate.yaml"]
	if !ok {
		t.Fatal("the Dockerfile copies no /etc/kvgate/kvgate.yaml")
	}
	cfgText, err := os.ReadFile(filepath.Join("../..", src))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^listen: *(\S+)`).FindSubmatch(cfgText); m == nil || !strings.HasSuffix(string(m[1]), ":"+expose) || !strings.HasPrefix(string(m[1]), "0.0.0.0:") {
		t.Errorf("%s listens on %q: want 0.0.0.0:%s", src, m, expose)
	}

	// Run the HEALTHCHECK as written, pointed at a real gateway.
	gwURL, stopSim := startStack(t)
	gw, _ := url.Parse(gwURL)
	withAddr := func() []string {
		out := append([]string{}, args...)
		for i := range out {
			if out[i] == probe.String() {
				u := *probe
				u.Host = gw.Host
				out[i] = u.String()
			}
		}
		return append([]string{"health"}, out...)
	}
	if code, out, errOut := runCLI(t, withAddr()...); code != exitOK {
		t.Fatalf("HEALTHCHECK against a ready gateway: exit %d: %s%s", code, out, errOut)
	}
	stopSim()
	waitFor(t, "the HEALTHCHECK to fail", func() bool { code, _, _ := runCLI(t, withAddr()...); return code == exitNo })
}

// The image's default config listens on 0.0.0.0 and takes its backend from
// the environment: valid with KVGATE_BACKEND_URL set, refused naming it
// without.
func TestContainerConfig(t *testing.T) {
	const cfg = "../../examples/kvgate-container.yaml"
	t.Setenv("KVGATE_BACKEND_URL", "http://vllm.example:8000")
	code, out, errOut := runCLI(t, "serve", "--check-config", "--config", cfg, "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep gateway.CheckReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Listen != "0.0.0.0:8080" || len(rep.GPUs) != 1 || rep.GPUs[0].BudgetBytes <= 0 {
		t.Errorf("report %+v", rep)
	}
	t.Setenv("KVGATE_GPU_MEMORY", "8GiB") // Llama-3-8B's weights do not fit
	if code, _, errOut := runCLI(t, "serve", "--check-config", "--config", cfg); code != exitUsage || !strings.Contains(errOut, "backends[0]") {
		t.Errorf("8 GiB: exit %d: %s", code, errOut)
	}
	os.Unsetenv("KVGATE_BACKEND_URL")
	code, _, errOut = runCLI(t, "serve", "--check-config", "--config", cfg)
	if code != exitUsage || !strings.Contains(errOut, "KVGATE_BACKEND_URL is not set") {
		t.Errorf("unset URL: exit %d: %s", code, errOut)
	}
}

func TestCheckConfig(t *testing.T) {
	code, out, errOut := runCLI(t, "serve", "--check-config", "--config", "../../examples/kvgate.yaml")
	if code != exitOK || !strings.Contains(out, "is valid") || !strings.Contains(out, "gpu gpu0: KV budget 2.0 GiB") {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("admission: {ceiling: 3}\nmodels: []\n"), 0o644)
	if code, _, errOut := runCLI(t, "serve", "--check-config", "--config", bad); code != exitUsage || !strings.Contains(errOut, "admission.ceiling") {
		t.Errorf("bad config: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "serve", "--check-config"); code != exitUsage || !strings.Contains(errOut, "--config") {
		t.Errorf("no --config: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "serve", "--json"); code != exitUsage || !strings.Contains(errOut, "--check-config") {
		t.Errorf("--json alone: exit %d: %s", code, errOut)
	}
}
