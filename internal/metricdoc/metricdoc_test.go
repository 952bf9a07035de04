package metricdoc

import (
	"strings"
	"testing"
)

const table = `# Metrics

## prog a

| name | type | labels | meaning |
|---|---|---|---|
| ` + "`a_requests_total`" + ` | counter | model, reason | Requests |
| ` + "`a_up`" + ` | gauge | — | Up |

## prog b

| name | type | labels | meaning |
|---|---|---|---|
| ` + "`b_x_total`" + ` | counter | — | X |
`

func TestParseReadsOneSection(t *testing.T) {
	rows, err := Parse(strings.NewReader(table), "prog a")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Name != "a_requests_total" || strings.Join(rows[0].Labels, ",") != "model,reason" || rows[1].Labels != nil {
		t.Fatalf("rows %+v", rows)
	}
}

func TestParseRefusesBadTables(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"no section", table, "no metric table"},
		{"bad type", "## s\n| `x` | countr | — | m |\n", "unknown type"},
		{"twice", "## s\n| `x` | gauge | — | m |\n| `x` | gauge | — | m |\n", "twice"},
		{"cells", "## s\n| `x` | gauge | m |\n", "want 4 cells"},
		{"no meaning", "## s\n| `x` | gauge | — |  |\n", "no meaning"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			section := "s"
			if tc.name == "no section" {
				section = "prog c"
			}
			_, err := Parse(strings.NewReader(tc.doc), section)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

const exposition = `# HELP a_requests_total Requests.
# TYPE a_requests_total counter
a_requests_total{model="m",reason="ok"} 3
# HELP a_up Up.
# TYPE a_up gauge
a_up 1
# HELP a_extra Not documented.
# TYPE a_extra gauge
a_extra{gpu="g"} 1
`

func TestCompareFindsEveryDifference(t *testing.T) {
	rows, _ := Parse(strings.NewReader(table), "prog a")
	rows = append(rows, Row{Name: "a_gone", Type: "gauge", Meaning: "m"})
	rows[1].Type = "counter"
	rows[1].Name = "a_up"
	rows[0].Labels = []string{"model"}
	fams, err := ParseText(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(Compare(rows, fams, nil), "\n")
	for _, want := range []string{
		"a_gone is documented but not exported",
		"a_extra is exported but not documented",
		"a_up: documented as counter, exported as gauge",
		"a_requests_total: documented labels [model], exported [model reason]",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if d := Compare(rows, fams, func(n string) bool { return n == "a_extra" }); strings.Contains(strings.Join(d, "\n"), "a_extra") {
		t.Errorf("skip ignored: %v", d)
	}
}

func TestLintRules(t *testing.T) {
	bad := `# HELP kv_queued_total Not a counter.
# TYPE kv_queued_total gauge
kv_queued_total 1
# HELP kv_preemptions A counter without _total.
# TYPE kv_preemptions counter
kv_preemptions 1
# HELP kv:rule_like Colon.
# TYPE kv:rule_like gauge
kv:rule_like 1
# HELP kv_backend_up A state as a changing label.
# TYPE kv_backend_up gauge
kv_backend_up{backend="b",state="open"} 0
# HELP kv_circuit_state Two states on at once.
# TYPE kv_circuit_state gauge
kv_circuit_state{backend="b",state="open"} 1
kv_circuit_state{backend="b",state="closed"} 1
# HELP vllm:num_requests_running Compat name.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 1
`
	fams, err := ParseText(strings.NewReader(bad))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(Lint(fams, func(n string) bool { return strings.HasPrefix(n, "vllm:") }), "\n")
	for _, want := range []string{
		"kv_queued_total: a gauge; counters and only counters end in _total",
		"kv_preemptions: a counter; counters and only counters end in _total",
		"kv:rule_like: colons are for recording rules",
		"kv_backend_up{backend=b}: 1 state series, 0 of them 1",
		"kv_circuit_state{backend=b}: 2 state series, 2 of them 1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "vllm:") {
		t.Errorf("a compat name was linted:\n%s", got)
	}
	good := `# HELP kv_backend_state One series per state.
# TYPE kv_backend_state gauge
kv_backend_state{backend="b",state="open"} 0
kv_backend_state{backend="b",state="closed"} 1
# HELP kv_requests_total Requests.
# TYPE kv_requests_total counter
kv_requests_total 2
`
	fams, _ = ParseText(strings.NewReader(good))
	if p := Lint(fams, nil); len(p) != 0 {
		t.Errorf("good families: %v", p)
	}
}
