package benchkit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func newKit(t *testing.T) *Kit {
	t.Helper()
	k, err := New(context.Background(), "", t.TempDir(), "unused")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.StopAll)
	return k
}

func TestWaitReady(t *testing.T) {
	tests := []struct {
		name, script string
		ready        bool
		wantErr      string // "" = ready
	}{
		{"ready at once", "sleep 60", true, ""},
		{"exits first, its log in the error", "echo listen failed; exit 3", false, "exited at start; the end of"},
		{"never ready", "sleep 60", false, "not ready within"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := newKit(t)
			p, err := k.Exec(context.Background(), "proc", "sh", "-c", tc.script)
			if err != nil {
				t.Fatal(err)
			}
			err = p.waitReady("sh", 300*time.Millisecond, func() bool { return tc.ready })
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("waitReady: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("waitReady: %v, want an error containing %q", err, tc.wantErr)
			}
			if strings.Contains(tc.script, "echo") && !strings.Contains(err.Error(), "listen failed") {
				t.Errorf("error %q does not carry the log", err)
			}
		})
	}
}

func TestStopAllEndsEveryProcess(t *testing.T) {
	k := newKit(t)
	var procs []*Process
	for range 3 {
		p, err := k.Exec(context.Background(), "sleeper", "sleep", "60")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	procs[1].Kill()
	k.StopAll()
	for i, p := range procs {
		if p.Alive() {
			t.Errorf("process %d still running after StopAll", i)
		}
	}
}

func TestFreePortsAreDistinct(t *testing.T) {
	ports, err := FreePorts(16)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p <= 0 {
			t.Fatalf("ports %v: %d given twice or not a port", ports, p)
		}
		seen[p] = true
	}
}

func TestStartRedis(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed")
	}
	k := newKit(t)
	p, err := k.StartRedis(context.Background(), bin, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.URL, "redis://127.0.0.1:") || !strings.HasSuffix(p.URL, "/0") {
		t.Errorf("URL %q", p.URL)
	}
	// Stopped and started again where its clients expect it.
	p.Stop()
	again, err := k.StartRedis(context.Background(), bin, p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if again.URL != p.URL {
		t.Errorf("restarted at %s, want %s", again.URL, p.URL)
	}
}

func TestStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"gpus":[{"capacity_bytes":42}]}`))
	}))
	defer srv.Close()
	var v struct {
		GPUs []struct {
			Capacity int64 `json:"capacity_bytes"`
		} `json:"gpus"`
	}
	if err := Status(context.Background(), srv.Client(), srv.URL, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.GPUs) != 1 || v.GPUs[0].Capacity != 42 {
		t.Errorf("read %+v", v)
	}
	if err := Status(context.Background(), srv.Client(), srv.URL+"/nothing", &v); err == nil {
		t.Error("a 404 was read as a status")
	}
}
