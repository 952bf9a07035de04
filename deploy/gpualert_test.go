package deploy

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	engine "github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/template"
)

// The GPU memory alerts carry the snapshot: their descriptions, expanded by
// Prometheus's own template engine against series shaped as kvgate exports
// them, name each process on the GPU with what it holds.
func TestGPUMemoryAlertsCarryTheSnapshot(t *testing.T) {
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	st := promqltest.LoadedStorage(t, `load 1m
		kvgate_gpu_process_memory_bytes{gpu="g0",pid="17",process="vllm",owner="backend",instance="a"} 64424509440x10
		kvgate_gpu_process_memory_bytes{gpu="g0",pid="4242",process="python3",owner="other",instance="a"} 8589934592x10
		kvgate_gpu_process_memory_bytes{gpu="g1",pid="99",process="elsewhere",owner="other",instance="a"} 1x10
		kvgate_gpu_memory_unattributed_bytes{gpu="g0",instance="a"} 536870912x10
		kvgate_gpu_memory_free_bytes{gpu="g0",instance="a"} 1073741824x10`)
	ng := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	at := time.Unix(0, 0).Add(9 * time.Minute)
	query := func(ctx context.Context, q string, ts time.Time) (engine.Vector, error) {
		qr, err := ng.NewInstantQuery(ctx, st, nil, q, ts)
		if err != nil {
			return nil, err
		}
		res := qr.Exec(ctx)
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Vector()
	}
	for _, tc := range []struct {
		alert  string
		labels map[string]string
		want   []string
	}{
		{"KvgateGPUMemoryBelowFloor", map[string]string{"gpu": "g0"},
			[]string{"vllm (pid 17, backend): 60Gi", "python3 (pid 4242, other): 8Gi", "held by no listed process: 512Mi"}},
		{"KvgateGPUMemoryEvent", map[string]string{"gpu": "g0", "event": "contention"},
			[]string{"contention on GPU g0", "python3 (pid 4242, other): 8Gi", "free: 1Gi"}},
	} {
		var desc string
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert == tc.alert {
					desc = r.Annotations["description"]
				}
			}
		}
		if desc == "" {
			t.Fatalf("no alert %s", tc.alert)
		}
		data := template.AlertTemplateData(tc.labels, nil, "", engine.Sample{F: 1})
		exp := template.NewTemplateExpander(context.Background(), "{{$labels := .Labels}}{{$value := .Value}}"+desc, tc.alert,
			data, model.TimeFromUnixNano(at.UnixNano()), query, nil, nil)
		got, err := exp.Expand()
		if err != nil {
			t.Fatalf("%s: %v", tc.alert, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: description lacks %q:\n%s", tc.alert, w, got)
			}
		}
		if strings.Contains(got, "elsewhere") {
			t.Errorf("%s: another GPU's process in the snapshot:\n%s", tc.alert, got)
		}
	}
}
