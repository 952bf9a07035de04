package gateway

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// Each change of a backend's circuit is logged once, at info; repeating a
// state logs nothing, and a backend's first, closed, state is no news.
func TestBackendStateChangesAreLoggedOnce(t *testing.T) {
	type step struct {
		backend string
		state   backends.CircuitState
		want    string // the log line's message, "" for none
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"start closed, stay closed", []step{{"a", backends.StateClosed, ""}, {"a", backends.StateClosed, ""}}},
		{"down and up", []step{
			{"a", backends.StateClosed, ""},
			{"a", backends.StateOpen, "backend down"},
			{"a", backends.StateOpen, ""},
			{"a", backends.StateClosed, "backend up"},
		}},
		{"timeouts: open, half-open, open, half-open, closed", []step{
			{"a", backends.StateOpen, "backend down"},
			{"a", backends.StateHalfOpen, "backend on trial"},
			{"a", backends.StateHalfOpen, ""},
			{"a", backends.StateOpen, "backend down"},
			{"a", backends.StateHalfOpen, "backend on trial"},
			{"a", backends.StateClosed, "backend up"},
		}},
		{"backends apart", []step{
			{"a", backends.StateClosed, ""},
			{"b", backends.StateOpen, "backend down"},
			{"a", backends.StateClosed, ""},
			{"b", backends.StateClosed, "backend up"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			bl := newBackendLog(slog.New(slog.NewTextHandler(&buf, nil)))
			for i, s := range c.steps {
				buf.Reset()
				bl.state(s.backend, s.state, "connection refused", "")
				got := buf.String()
				switch {
				case s.want == "" && got != "":
					t.Errorf("step %d (%s → %s): logged %q", i, s.backend, s.state, got)
				case s.want != "" && (!strings.Contains(got, s.want) || !strings.Contains(got, "level=INFO") ||
					!strings.Contains(got, "backend="+s.backend) || !strings.Contains(got, "to="+string(s.state)) || strings.Count(got, "\n") != 1):
					t.Errorf("step %d (%s → %s): want one info line %q, got %q", i, s.backend, s.state, s.want, got)
				}
			}
		})
	}
}

// A GPU's budget is logged when its backends' pool is first known, then at
// each change of the capacity, and not on reports that change nothing.
func TestBudgetChangesAreLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	bl := newBackendLog(slog.New(slog.NewTextHandler(&buf, nil)))
	g := &gpu{name: "gpu0", nominal: 1000}
	for i, s := range []struct {
		pool, capacity int64
		want           string
	}{
		{2000, 1000, "GPU budget learned"},
		{2000, 1000, ""},
		{800, 800, "GPU budget changed"},
		{800, 800, ""},
		{2000, 1000, "GPU budget changed"},
	} {
		buf.Reset()
		bl.budget(g, s.pool, s.capacity)
		if got := buf.String(); s.want == "" && got != "" || s.want != "" && (!strings.Contains(got, s.want) || strings.Count(got, "\n") != 1) {
			t.Errorf("report %d: want %q, got %q", i, s.want, got)
		}
	}
}

// The warning about a pool larger than the budget names the setting that
// made the budget: admission.ceiling and vLLM's --gpu-memory-utilization for
// a budget computed from gpu_memory, the backend's kv_budget for one set
// by hand (where the utilization is not the fix).
func TestOversizedPoolNamesTheRightFix(t *testing.T) {
	cases := []struct {
		name, backend string
		want, not     []string
	}{
		{"computed from gpu_memory", "gpu_memory: 24GiB",
			[]string{"--gpu-memory-utilization", "admission.ceiling"}, []string{"kv_budget"}},
		{"kv_budget", "kv_budget: 2GiB",
			[]string{"backends[0].kv_budget", "raise it to the pool (4.0 GiB)", "--kv-cache-memory-bytes 2147483648"}, []string{"utilization", "ceiling"}},
		{"kv_budget beside gpu_memory", "gpu_memory: 24GiB\n    kv_budget: 2GiB",
			[]string{"backends[0].kv_budget"}, []string{"utilization"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			yaml := strings.Replace(baseConfig("http://127.0.0.1:1", ""), "gpu_memory: 24GiB", c.backend, 1)
			cfg, err := Parse([]byte(yaml), ".")
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(cfg, Options{DisableProbes: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown(t.Context())
			fix := s.rt.Load().gpus["gpu0"].oversizeFix(4 << 30)
			for _, w := range c.want {
				if !strings.Contains(fix, w) {
					t.Errorf("%q is not in %q", w, fix)
				}
			}
			for _, n := range c.not {
				if strings.Contains(fix, n) {
					t.Errorf("%q is in %q", n, fix)
				}
			}
		})
	}
}

// A 429 queue_full says queueing is disabled, naming the setting, when the
// class never queues; a full queue is a full queue.
func TestQueueingOffNamesTheSetting(t *testing.T) {
	cases := []struct {
		name, admission, class, want string
	}{
		{"default queue", "", "standard", ""},
		{"queue disabled for all", "admission: {queue: {max_requests: -1}}", "standard", "admission.queue.max_requests"},
		{"a class's own", "admission: {classes: [{name: a}, {name: standard, max_requests: -1}]}", "standard", "admission.classes[1].max_requests"},
		{"a class queues despite the default", "admission: {queue: {max_requests: -1}, classes: [{name: standard, max_requests: 5}]}", "standard", ""},
		{"another class is off", "admission: {classes: [{name: a, max_requests: -1}, {name: standard}]}", "standard", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(baseConfig("http://127.0.0.1:1", c.admission+"\n")), ".")
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.queueingOff(c.class); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// End to end, with probes: a backend whose pool is larger than the
// kv_budget gets a warning naming kv_budget (not vLLM's utilization), and
// the budget learned from its reports is logged once, however many
// reports follow.
func TestKVBudgetBelowThePoolIsLoggedOnce(t *testing.T) {
	_, simURL := startSim(t, nil) // vLLM's default --gpu-memory-utilization, 0.9
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := strings.Replace(baseConfig(simURL, ""), "gpu_memory: 24GiB", "kv_budget: 1GiB", 1)
	gw, _ := startGateway(t, cfg, Options{Logger: logger})
	eventually(t, "the pool's warning", func() bool { return strings.Contains(logs.String(), "KV pool is larger") })
	be := gw.rt.Load().upstreams.Backends()[0]
	var last time.Time
	reports := 0
	eventually(t, "more reports", func() bool {
		if kv, ok := be.KV(); ok && !kv.At.Equal(last) {
			last, reports = kv.At, reports+1
		}
		return reports > 3
	})
	out := logs.String()
	if n := strings.Count(out, "KV pool is larger"); n != 1 {
		t.Errorf("the warning was logged %d times", n)
	}
	if !strings.Contains(out, "backends[0].kv_budget is below the pool") || strings.Contains(out, "gpu-memory-utilization") {
		t.Errorf("the warning names the wrong fix:\n%s", out)
	}
	if n := strings.Count(out, "GPU budget learned"); n != 1 {
		t.Errorf("the budget was logged as learned %d times:\n%s", n, out)
	}
	if strings.Contains(out, "GPU budget changed") {
		t.Errorf("a budget that did not change was logged as changed:\n%s", out)
	}
}
