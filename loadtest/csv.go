package loadtest

import (
	"encoding/csv"
	"io"
	"strconv"
)

// CSVHeader is the header row of WriteCSV; one row a step follows.
var CSVHeader = []string{
	"target", "mode", "level", "attempts", "verdict", "safe", "reasons",
	"sent", "warmup", "warmup_overflow", "warmup_failed", "ok", "shed_429", "client_4xx", "server_5xx", "overflow", "conn_error", "timeout", "incomplete", "dropped",
	"window_s", "requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "mean_prompt_tokens", "mean_output_tokens",
	"ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
	"itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
	"tpot_p50_ms", "tpot_p99_ms",
	"e2e_mean_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
	"kv_peak", "kv_mean", "preemptions", "oom_events", "peak_running", "peak_waiting",
	"slo_attainment", "slo_ci_low", "slo_ci_high", "slo_verdict",
	"saturated", "stopped_early",
	"price_per_hour", "cost_per_million_output_tokens", "run_cost",
}

// WriteCSV writes one row a step. Unknown figures (no KV metrics, no SLO,
// no samples) are empty cells, never zeros.
func WriteCSV(w io.Writer, r *Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	prices := map[string]float64{}
	for _, t := range r.Targets {
		prices[t.Name] = t.PricePerHour
	}
	for i := range r.Steps {
		s := &r.Steps[i]
		n := s.Requests
		row := []string{
			s.Target, string(s.Mode), fnum(s.Level), strconv.Itoa(s.Attempts), s.Verdict, strconv.FormatBool(s.Safe), joinReasons(s.Reasons),
			itoa(n.Sent), itoa(n.Warmup), itoa(n.WarmupOverflow), itoa(n.WarmupFailed), itoa(n.OK), itoa(n.Shed), itoa(n.Client4xx), itoa(n.Server5xx), itoa(n.Overflow),
			itoa(n.ConnError), itoa(n.Timeout), itoa(n.Incomplete), itoa(n.Dropped),
			fnum(s.WindowS), fnum(s.RequestsPerS), fnum(s.OutputTokensPerS), fnum(s.TotalTokensPerS), fnum(s.MeanPromptTokens), fnum(s.MeanOutputTokens),
		}
		row = append(row, mean(s.TTFT), pct(s.TTFT, 50), pct(s.TTFT, 90), pct(s.TTFT, 99))
		row = append(row, pct(s.ITL, 50), pct(s.ITL, 90), pct(s.ITL, 99))
		row = append(row, pct(s.TPOT, 50), pct(s.TPOT, 99))
		row = append(row, mean(s.E2E), pct(s.E2E, 50), pct(s.E2E, 90), pct(s.E2E, 99))
		if kv := s.KV; kv != nil {
			row = append(row, fnum(kv.PeakUsage), fnum(kv.MeanUsage), fnum(kv.Preemptions), fnum(kv.OOMEvents), fnum(kv.PeakRunning), fnum(kv.PeakWaiting))
		} else {
			row = append(row, "", "", "", "", "", "")
		}
		if slo := s.SLO; slo != nil {
			row = append(row, fnum(slo.Attainment), fnum(slo.Low), fnum(slo.High), slo.Verdict)
		} else {
			row = append(row, "", "", "", "")
		}
		row = append(row, strconv.FormatBool(s.Saturation != nil && s.Saturation.Saturated), s.StoppedEarly)
		if c := s.Cost; c != nil {
			perMTok := ""
			if c.PerMillionOutputTokens != nil {
				perMTok = fnum(*c.PerMillionOutputTokens)
			}
			row = append(row, fnum(prices[s.Target]), perMTok, fnum(c.Run))
		} else {
			row = append(row, "", "", "")
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func itoa(n int) string { return strconv.Itoa(n) }

func fnum(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

func pct(s Summary, p int) string {
	if s.N == 0 {
		return ""
	}
	switch p {
	case 50:
		return strconv.FormatFloat(s.P50, 'f', 3, 64)
	case 90:
		return strconv.FormatFloat(s.P90, 'f', 3, 64)
	}
	return strconv.FormatFloat(s.P99, 'f', 3, 64)
}

func mean(s Summary) string {
	if s.N == 0 {
		return ""
	}
	return strconv.FormatFloat(s.Mean, 'f', 3, 64)
}
