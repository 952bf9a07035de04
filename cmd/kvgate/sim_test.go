package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

func TestSimFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization must be in (0, 1]"},
		{[]string{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization must be in (0, 1]"},
		{[]string{"--block-size", "0"}, "--block-size must be >= 1"},
		{[]string{"--max-num-seqs", "0"}, "--max-num-seqs must be >= 1"},
		{[]string{"--max-model-len", "1"}, "--max-model-len: must be >= 2"},
		{[]string{"--max-model-len", "100000"}, "--max-model-len: 100000 is greater than the model's max_position_embeddings 8192"},
		{[]string{"--gpu-memory", "10GiB"}, "--gpu-memory: weights do not fit"},
		{[]string{"--gpu-memory", "0GiB"}, "--gpu-memory must be > 0"},
		{[]string{"--gpu-memory", "24"}, "has no unit"},
		{[]string{"--gpu-memory", "lots"}, `invalid value "lots" for flag -gpu-memory`},
		{[]string{"--weights-bytes", "0"}, "--weights-bytes must be > 0"},
		{[]string{"--gpu-memory", "18GiB", "--max-model-len", "8192"}, "--max-model-len: one sequence of max_model_len 8192 tokens needs 512 KV blocks"},
		{[]string{"--on-overflow", "explode"}, `--on-overflow: must be "preempt" or "oom", got "explode"`},
		{[]string{"--oom-restart", "-1s"}, "--oom-restart must be >= 0"},
		{[]string{"--step-base", "-5ms"}, "--step-base must be >= 0"},
		{[]string{"--time-scale", "-1"}, "--time-scale: must be in [0, 1e6]"},
		{[]string{"--output-len", "poisson:3"}, "--output-len: invalid length distribution"},
		{[]string{"--listen", "nowhere"}, `--listen "nowhere"`},
		{[]string{"--model", ""}, "--model must not be empty"},
		{[]string{"--model-config", "/nonexistent/config.json"}, "--model-config /nonexistent/config.json"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--kv-events-config", "{nope"}, "--kv-events-config: not vLLM's KV events JSON"},
		{[]string{"--kv-events-config", `{"enable_kv_cache_events": true, "publisher": "nats"}`}, `publisher "nats": only zmq`},
		{[]string{"--kv-events-config", `{"enable_kv_cache_events": true, "encoding": "xml"}`}, `encoding "xml" is not map or positional`},
		{[]string{"--kv-events-config", `{"enable_kv_cache_events": true}`, "--enable-prefix-caching=false"}, "--kv-events-config: KV events need prefix caching on"},
	}
	for _, tc := range tests {
		code, _, errOut := runCLI(t, append([]string{"sim"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("sim %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestSimHelp(t *testing.T) {
	code, out, _ := runCLI(t, "sim", "--help")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"listen", "model", "model-config", "gpu-memory", "gpu-memory-utilization", "weights-bytes", "block-size",
		"max-model-len", "max-num-seqs", "on-overflow", "oom-restart", "step-base", "step-per-seq", "prefill-per-token", "time-scale",
		"output-len", "seed", "enable-prefix-caching"} {
		if !strings.Contains(out, "-"+f+" ") && !strings.Contains(out, "-"+f+"\n") { // a bool flag ends its line
			t.Errorf("--help lacks -%s", f)
		}
	}
	if code, out, _ := runCLI(t, "--help"); code != exitOK || !strings.Contains(out, "sim ") {
		t.Errorf("kvgate --help does not list sim")
	}
}

var simLine = regexp.MustCompile(`^kvgate sim: serving (\S+) on (http://\S+), KV cache (\d+) blocks of (\d+) tokens = (\d+) tokens, on overflow (\w+)\n$`)

// startSim runs kvgate sim with args until the returned stop is called.
func startSim(t *testing.T, args ...string) (base string, line []string, stop func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"sim", "--listen", "127.0.0.1:0"}, args...), &out, &errOut) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := simLine.FindStringSubmatch(out.String()); m != nil {
			line = m
			break
		}
		select {
		case code := <-done:
			t.Fatalf("kvgate sim exited %d before listening: %s%s", code, out.String(), errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no listening line; stdout %q", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopped := false
	stop = func() (int, string) {
		stopped = true
		cancel() // what SIGINT or SIGTERM does to run's context
		select {
		case code := <-done:
			return code, errOut.String()
		case <-time.After(15 * time.Second):
			t.Fatal("kvgate sim did not shut down")
			return 0, ""
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return line[2], line, stop
}

func TestSimServesAndShutsDown(t *testing.T) {
	base, line, stop := startSim(t, "--gpu-memory", "24GiB", "--time-scale", "0.01", "--model", "sim-llama", "--seed", "3")
	// Llama-3-8B on 24 GiB at 0.9: 2888 blocks, as kvbudget computes.
	if line[1] != "sim-llama" || line[3] != "2888" || line[4] != "16" || line[5] != "46208" || line[6] != "preempt" {
		t.Fatalf("listening line %q", line[0])
	}
	resp, err := http.Get(base + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"sim-llama","prompt":"hi","max_tokens":5,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	if code, errOut := stop(); code != exitOK {
		t.Fatalf("exit %d after shutdown: %s", code, errOut)
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Error("still serving after shutdown")
	}
}

// --enable-prefix-caching is on by default, as in vLLM V1: the same prompt
// twice is found the second time; =false turns the cache, and its counting,
// off.
func TestSimPrefixCachingFlag(t *testing.T) {
	// 40 tokens: 2 full blocks, both found by the second request.
	prompt := strings.TrimSuffix(strings.Repeat("7,", 40), ",")
	body := `{"model":"llama-3-8b","prompt":[` + prompt + `],"max_tokens":2}`
	for _, tc := range []struct {
		args                  []string
		wantQueries, wantHits string
	}{
		{nil, "80", "32"},
		{[]string{"--enable-prefix-caching=false"}, "0", "0"},
	} {
		base, _, _ := startSim(t, append([]string{"--time-scale", "0"}, tc.args...)...)
		for range 2 {
			resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%v: status %d", tc.args, resp.StatusCode)
			}
		}
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for name, want := range map[string]string{"vllm:prefix_cache_queries_total": tc.wantQueries, "vllm:prefix_cache_hits_total": tc.wantHits} {
			line := name + `{engine="0",model_name="llama-3-8b"} ` + want + "\n"
			if !strings.Contains(string(m), line) {
				t.Errorf("%v: /metrics lacks %q", tc.args, line)
			}
		}
	}
}

func TestSimShutdownDuringAStream(t *testing.T) {
	// Real time: this stream would take a minute; shutdown waits for it
	// at most the grace period, but a cancelled client ends it sooner.
	base, _, stop := startSim(t, "--model-config", llama3, "--on-overflow", "oom", "--max-model-len", "4096")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions",
		strings.NewReader(`{"model":"llama-3-8b","prompt":"hi","max_tokens":4000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		cancel() // the client leaves; the server aborts the stream
	}()
	start := time.Now()
	code, errOut := stop()
	resp.Body.Close()
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if d := time.Since(start); d > simShutdownGrace {
		t.Errorf("shutdown took %v", d)
	}
}
