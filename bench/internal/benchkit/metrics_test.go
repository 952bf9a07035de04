package benchkit

import "testing"

func TestMetricsValueAndSum(t *testing.T) {
	m := Metrics{
		`kvsim_oom_events_total`:                           3,
		`kvgate_requests_total{outcome="ok",tenant="a"}`:   10,
		`kvgate_requests_total{outcome="ok",tenant="b"}`:   5,
		`kvgate_requests_total{outcome="shed",tenant="a"}`: 2,
		`kvgate_requests_total_extra`:                      100,
	}
	tests := []struct {
		name   string
		metric string
		want   []string
		sum    float64
		found  bool
	}{
		{"no labels", "kvsim_oom_events_total", nil, 3, true},
		{"every series of a name, not a longer name", "kvgate_requests_total", nil, 17, true},
		{"by label", "kvgate_requests_total", []string{`outcome="ok"`}, 15, true},
		{"by two labels", "kvgate_requests_total", []string{`outcome="ok"`, `tenant="b"`}, 5, true},
		{"absent is not a zero", "vllm:kv_cache_usage_perc", nil, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := m.Sum(tc.metric, tc.want...); got != tc.sum {
				t.Errorf("Sum = %g, want %g", got, tc.sum)
			}
			if _, ok := m.Value(tc.metric, tc.want...); ok != tc.found {
				t.Errorf("Value found = %v, want %v", ok, tc.found)
			}
		})
	}
}
