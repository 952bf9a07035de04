package deploy

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// Each alert's expression, evaluated by Prometheus's own engine on series
// shaped as kvgate exports them: it fires on the trouble it names, with the
// labels its annotations use, and stays quiet on a healthy gateway.
func TestAlertsFireWhenTheyShould(t *testing.T) {
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	exprs := map[string]string{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	for _, tc := range []struct {
		alert       string
		fire, quiet string // load blocks, 1m apart, evaluated at 10m
		want        string // the firing result
	}{
		{"KvgateKVAboveCeiling",
			`kvgate_kv_used_bytes{gpu="g0",instance="a"} 3000x10
			 kvgate_kv_capacity_bytes{gpu="g0",instance="a"} 2000x10`,
			`kvgate_kv_used_bytes{gpu="g0",instance="a"} 1500x10
			 kvgate_kv_capacity_bytes{gpu="g0",instance="a"} 2000x10`,
			`{gpu="g0"} 3000`},
		{"KvgateKVUnaccounted",
			`kvgate_kv_unaccounted_bytes{gpu="g0",instance="a"} 0 0 600x8
			 kvgate_kv_unaccounted_bytes{gpu="g1",instance="a"} 0x10`,
			`kvgate_kv_unaccounted_bytes{gpu="g0",instance="a"} 0x10`,
			`{gpu="g0"} 600`},
		{"KvgateBackendPreempting",
			`kvgate_backend_preemptions_total{backend="b0",instance="a"} 0+60x10`,
			`kvgate_backend_preemptions_total{backend="b0",instance="a"} 7x10`,
			`{backend="b0"} 1`},
		{"KvgateShedRateHigh",
			`kvgate_requests_total{model="m",outcome="ok",reason="",instance="a"} 0+540x10
			 kvgate_requests_total{model="m",outcome="shed",reason="queue_full",instance="a"} 0+60x10`,
			`kvgate_requests_total{model="m",outcome="ok",reason="",instance="a"} 0+600x10
			 kvgate_requests_total{model="m",outcome="shed",reason="queue_full",instance="a"} 0+1x10`,
			`{model="m"} 0.1`},
		{"KvgateBackendDown",
			`kvgate_backend_up{backend="b0",instance="a"} 0x10
			 kvgate_backend_up{backend="b1",instance="a"} 1x10`,
			`kvgate_backend_up{backend="b0",instance="a"} 1x10`,
			`{backend="b0"} 0`},
		{"KvgateNoBackendUp",
			`kvgate_backend_up{backend="b0",instance="a"} 0x10
			 kvgate_backend_up{backend="b1",instance="a"} 0x10`,
			`kvgate_backend_up{backend="b0",instance="a"} 0x10
			 kvgate_backend_up{backend="b1",instance="a"} 1x10`,
			`{instance="a"} 0`},
		{"KvgateConfigReloadFailed",
			`kvgate_config_last_reload_successful{instance="a"} 1 1 1 0x7`,
			`kvgate_config_last_reload_successful{instance="a"} 1 0 1x8`,
			`{instance="a"} 0`},
		{"KvgateBackendMetricsStale",
			`kvgate_backend_last_report_timestamp_seconds{backend="b0",instance="a"} 0 60 120 120x7
			 kvgate_backend_up{backend="b0",instance="a"} 1x10`,
			`kvgate_backend_last_report_timestamp_seconds{backend="b0",instance="a"} 0+60x10
			 kvgate_backend_up{backend="b0",instance="a"} 1x10
			 kvgate_backend_last_report_timestamp_seconds{backend="unscraped",instance="a"} 0x10
			 kvgate_backend_up{backend="unscraped",instance="a"} 1x10`,
			`{backend="b0"} 480`},
		{"KvgateBackendOutOfMemory",
			`kvgate_backend_overflows_total{gpu="g0",instance="a"} 0+1x10
			 kvgate_backend_overflows_total{gpu="g1",instance="a"} 0x10`,
			`kvgate_backend_overflows_total{gpu="g0",instance="a"} 3x10`,
			`{gpu="g0"} 5`},
		{"KvgateGuardStopping",
			`kvgate_admission_guard_stops_total{instance="a"} 0+60x10`,
			`kvgate_admission_guard_stops_total{instance="a"} 5x10`,
			`{} 1`},
		{"KvgateTokenizeFallback",
			`kvgate_tokenize_fallbacks_total{model="m",reason="error",instance="a"} 0+60x10
			 kvgate_tokenize_fallbacks_total{model="m",reason="timeout",instance="a"} 0x10`,
			`kvgate_tokenize_fallbacks_total{model="m",reason="error",instance="a"} 4x10`,
			`{model="m"} 1`},
		{"KvgateGPUMemoryBelowFloor",
			`kvgate_gpu_memory_below_floor{gpu="g0",instance="a"} 0 0 1x8
			 kvgate_gpu_memory_below_floor{gpu="g1",instance="a"} 0x10`,
			`kvgate_gpu_memory_below_floor{gpu="g0",instance="a"} 0x10`,
			`{gpu="g0"} 1`},
		{"KvgateGPUMemoryEvent",
			`kvgate_gpu_memory_events_total{gpu="g0",event="contention",instance="a"} 0 0 0 0 0 0 0 0 1 1 1
			 kvgate_gpu_memory_events_total{gpu="g0",event="oom",instance="a"} 0x10`,
			`kvgate_gpu_memory_events_total{gpu="g0",event="contention",instance="a"} 2x10`,
			`{gpu="g0",event="contention"} 1`},
		{"KvgateSharedBudgetFallback",
			`kvgate_shared_budget_fallback{gpu="g0",instance="a"} 0 0 1x8
			 kvgate_shared_budget_fallback{gpu="g0",instance="b"} 0x10`,
			`kvgate_shared_budget_fallback{gpu="g0",instance="a"} 0x10`,
			`{gpu="g0"} 1`},
	} {
		t.Run(tc.alert, func(t *testing.T) {
			expr, ok := exprs[tc.alert]
			if !ok {
				t.Fatalf("no alert %s in %s", tc.alert, alertsFile)
			}
			expr = strings.Join(strings.Fields(expr), " ")
			script := "load 1m\n" + indent(tc.fire) + "\n\neval instant at 10m " + expr + "\n    " + tc.want + "\n\nclear\n\n" +
				"load 1m\n" + indent(tc.quiet) + "\n\neval instant at 10m " + expr + "\n"
			promqltest.RunTest(t, script, promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery))
		})
	}
	for name := range exprs {
		found := false
		for _, a := range []string{"KvgateKVAboveCeiling", "KvgateBackendPreempting", "KvgateShedRateHigh", "KvgateBackendDown",
			"KvgateNoBackendUp", "KvgateConfigReloadFailed", "KvgateBackendMetricsStale", "KvgateSharedBudgetFallback",
			"KvgateBackendOutOfMemory", "KvgateGuardStopping", "KvgateTokenizeFallback", "KvgateGPUMemoryBelowFloor", "KvgateGPUMemoryEvent", "KvgateKVUnaccounted"} {
			found = found || a == name
		}
		if !found {
			t.Errorf("alert %s has no case here", name)
		}
	}
}

func indent(block string) string {
	var b strings.Builder
	for _, l := range strings.Split(block, "\n") {
		b.WriteString("    " + strings.TrimSpace(l) + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
