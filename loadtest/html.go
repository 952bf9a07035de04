package loadtest

import (
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
)

// WriteHTML writes a self-contained report: the answer, plots of throughput,
// p99 latency and peak KV usage against the load level (the ceiling drawn as
// a line, each target's safe level marked), the memory curve over the run,
// the results table and the configuration. It loads nothing: no script, no
// font, no stylesheet, no image from anywhere; compared targets share one
// table and one set of plots.
func WriteHTML(w io.Writer, r *Report) error {
	return reportTemplate.Execute(w, htmlView(r))
}

type htmlRow struct {
	Step           *StepReport
	Class          string
	Level          string
	TTFT50, TTFT99 string
	ITL50, ITL99   string
	E2E50, E2E99   string
	KV, Preempt    string
	OOM            int // overflowed requests, warm-up included
	SLO, SLOCI     string
	CostMTok, Cost string
	Reasons        string
}

type htmlData struct {
	Title      string
	Report     *Report
	Answer     []string
	Plots      []template.HTML
	Multi      bool
	Priced     bool
	Columns    int // of the steps table
	LevelName  string
	Rows       []htmlRow
	Config     [][2]string
	TargetInfo [][2]string
	Errors     []string
}

func htmlView(r *Report) htmlData {
	d := htmlData{Report: r, Multi: len(r.Targets) > 1, Priced: r.priced(), LevelName: "concurrency", Columns: 18}
	if d.Multi {
		d.Columns++
	}
	if d.Priced {
		d.Columns += 2
	}
	xTitle, xUnit := "concurrent requests", ""
	if r.Mode == ModeRate {
		d.LevelName, xTitle, xUnit = "rate (req/s)", "offered rate (requests/s)", "/s"
	}
	names := make([]string, 0, len(r.Targets))
	for _, t := range r.Targets {
		names = append(names, t.Name)
	}
	d.Title = "kvgate load test — " + strings.Join(names, " vs ")
	c := r.Config
	d.Answer = strings.Split(r.Answer, "\n")

	levels := map[float64]bool{}
	colors := map[string]string{}
	for i, t := range r.Targets {
		colors[t.Name] = palette[i%len(palette)]
	}
	byTarget := map[string][]*StepReport{}
	for i := range r.Steps {
		s := &r.Steps[i]
		levels[s.Level] = true
		byTarget[s.Target] = append(byTarget[s.Target], s)
	}
	var ticks []float64
	for l := range levels {
		ticks = append(ticks, l)
	}
	slices.Sort(ticks)
	logX := len(ticks) > 1 && ticks[0] > 0 && ticks[len(ticks)-1]/ticks[0] >= 8

	mk := func(id, title, yTitle string, yf func(float64) string, val func(*StepReport) (float64, bool)) *plot {
		p := &plot{id: id, title: title, xTitle: xTitle, yTitle: yTitle, yFmt: yf, logX: logX, xTicks: ticks}
		for _, t := range r.Targets {
			ss := byTarget[t.Name]
			sorted := slices.Clone(ss)
			slices.SortFunc(sorted, func(a, b *StepReport) int { return cmpFloat(a.Level, b.Level) })
			series := plotSeries{name: t.Name, color: colors[t.Name]}
			for _, s := range sorted {
				v, ok := val(s)
				if !ok {
					continue
				}
				tip := fmt.Sprintf("%s at %s%s: %s — %s", t.Name, fmtLevel(s.Level), xUnit, yf(v), s.Verdict)
				if len(s.Reasons) > 0 {
					tip += " (" + joinReasons(s.Reasons) + ")"
				}
				series.points = append(series.points, plotPoint{x: s.Level, y: v, verdict: s.Verdict, tip: tip})
			}
			p.series = append(p.series, series)
			if t.HasSafe {
				p.vlines = append(p.vlines, refLine{at: t.Safe, color: colorOK,
					label: fmt.Sprintf("safe: %s%s (%s)", fmtLevel(t.Safe), xUnit, t.Name)})
			}
		}
		return p
	}
	msFmt := func(v float64) string { return fmtMs(v) }
	pctFmt := func(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }
	tput := mk("throughput", "Throughput: output tokens per second", "output tokens/s", trimFloat,
		func(s *StepReport) (float64, bool) { return s.OutputTokensPerS, true })
	reqs := mk("requests", "Throughput: completed requests per second", "requests/s", trimFloat,
		func(s *StepReport) (float64, bool) { return s.RequestsPerS, true })
	ttft := mk("ttft", "p99 time to first token", "p99 TTFT", msFmt,
		func(s *StepReport) (float64, bool) { return s.TTFT.P99, s.TTFT.N > 0 })
	e2e := mk("e2e", "p99 end-to-end latency", "p99 end-to-end", msFmt,
		func(s *StepReport) (float64, bool) { return s.E2E.P99, s.E2E.N > 0 })
	kv := mk("kv", "Peak KV-cache usage", "peak KV usage", pctFmt,
		func(s *StepReport) (float64, bool) {
			if s.KV == nil {
				return 0, false
			}
			return s.KV.PeakUsage, true
		})
	kv.yMax = 1
	ceiling := r.Config.MaxKVUsage
	kv.hlines = append(kv.hlines, refLine{at: ceiling, color: colorCeiling, label: fmt.Sprintf("KV limit %.0f%%", 100*ceiling)})
	if r.Config.SLOTTFTMs > 0 {
		ttft.hlines = append(ttft.hlines, refLine{at: r.Config.SLOTTFTMs, color: colorCeiling, label: "SLO " + fmtMs(r.Config.SLOTTFTMs)})
	}
	if r.Config.SLOE2EMs > 0 {
		e2e.hlines = append(e2e.hlines, refLine{at: r.Config.SLOE2EMs, color: colorCeiling, label: "SLO " + fmtMs(r.Config.SLOE2EMs)})
	}

	// The memory curve: KV usage through the run, steps end to end.
	curve := &plot{id: "curve", title: "Memory curve: KV-cache usage through the run",
		xTitle: fmt.Sprintf("seconds of load (steps end to end), sampled every %s", fmtSeconds(c.ScrapeIntervalS)),
		yTitle: "KV usage", yFmt: pctFmt, yMax: 1, noMarker: true,
		hlines: []refLine{{at: ceiling, color: colorCeiling, label: fmt.Sprintf("KV limit %.0f%%", 100*ceiling)}}}
	for _, t := range r.Targets {
		series := plotSeries{name: t.Name, color: colors[t.Name]}
		offset := 0.0
		for _, s := range byTarget[t.Name] {
			if s.KV != nil {
				for _, c := range s.KV.Curve {
					series.points = append(series.points, plotPoint{x: offset + c.T, y: c.KVUsage})
				}
			}
			offset += s.WallS
		}
		curve.series = append(curve.series, series)
	}
	plots := []*plot{tput, reqs, ttft, e2e, kv, curve}
	if d.Priced {
		cost := mk("cost", "Cost per million output tokens", "cost / M output tokens", fmtMoney,
			func(s *StepReport) (float64, bool) {
				if s.Cost == nil || s.Cost.PerMillionOutputTokens == nil {
					return 0, false
				}
				return *s.Cost.PerMillionOutputTokens, true
			})
		plots = append(plots, cost)
	}
	for _, p := range plots {
		d.Plots = append(d.Plots, template.HTML(p.render())) // #nosec: render escapes every text it writes
	}

	for i := range r.Steps {
		s := &r.Steps[i]
		row := htmlRow{Step: s, Class: s.Verdict, Level: fmtLevel(s.Level), OOM: s.Requests.Overflow + s.Requests.WarmupOverflow,
			TTFT50: fmtMsOrDash(s.TTFT), TTFT99: fmtP99OrDash(s.TTFT), ITL50: fmtMsOrDash(s.ITL), ITL99: fmtP99OrDash(s.ITL),
			E2E50: fmtMsOrDash(s.E2E), E2E99: fmtP99OrDash(s.E2E), KV: "n/a", Preempt: "n/a", SLO: "-",
			Reasons: joinReasons(append(append([]string(nil), s.Reasons...), s.Notes...))}
		if s.KV != nil {
			row.KV, row.Preempt = fmt.Sprintf("%.1f%%", 100*s.KV.PeakUsage), fmt.Sprintf("%.0f", s.KV.Preemptions)
		}
		if s.SLO != nil {
			row.SLO = fmt.Sprintf("%.1f%%", 100*s.SLO.Attainment)
			row.SLOCI = fmt.Sprintf("[%.1f–%.1f]", 100*s.SLO.Low, 100*s.SLO.High)
		}
		row.CostMTok, row.Cost = costCells(s)
		for _, e := range s.Errors {
			d.Errors = append(d.Errors, fmt.Sprintf("%s %s %s: %d× %s: %s", s.Target, d.LevelName, fmtLevel(s.Level), e.Count, e.Outcome, truncate(e.Message, 200)))
		}
		d.Rows = append(d.Rows, row)
	}

	add := func(k, v string) { d.Config = append(d.Config, [2]string{k, v}) }
	add("mode", string(c.Mode))
	if c.Search {
		add("search", fmt.Sprintf("double from %s up to %s, then bisect (tolerance %s, relative %s)",
			fmtLevel(c.Levels[0]), fmtLevel(c.SearchMax), trimFloat(c.SearchTolerance), trimFloat(c.SearchRelTolerance)))
	} else {
		var ls []string
		for _, l := range c.Levels {
			ls = append(ls, fmtLevel(l))
		}
		add("levels", strings.Join(ls, ", "))
	}
	add("endpoint", fmt.Sprintf("%s, stream %v, ignore_eos %v", c.Endpoint, c.Stream, c.IgnoreEOS))
	add("prompt tokens", c.PromptTokens)
	add("output tokens", c.OutputTokens)
	per := []string{}
	if c.Requests > 0 {
		per = append(per, fmt.Sprintf("%d requests", c.Requests))
	}
	if c.DurationS > 0 {
		per = append(per, fmt.Sprintf("%g s", c.DurationS))
	}
	if len(per) == 0 {
		per = append(per, "max(100, 4 × level) requests")
	}
	add("per step", strings.Join(per, " or ")+fmt.Sprintf(", warm-up %d (0: one per worker)", c.Warmup))
	add("max KV usage", fmt.Sprintf("%.0f%% of the KV pool", 100*c.MaxKVUsage))
	add("KV sampling", fmt.Sprintf("/metrics every %s", fmtSeconds(c.ScrapeIntervalS)))
	slo := "none"
	if c.SLOTTFTMs > 0 || c.SLOE2EMs > 0 {
		var parts []string
		if c.SLOTTFTMs > 0 {
			parts = append(parts, "TTFT ≤ "+fmtMs(c.SLOTTFTMs))
		}
		if c.SLOE2EMs > 0 {
			parts = append(parts, "end-to-end ≤ "+fmtMs(c.SLOE2EMs))
		}
		slo = fmt.Sprintf("%s for %.1f%% of requests, at %.0f%% confidence", strings.Join(parts, " and "), 100*c.SLOAttainment, 100*c.Confidence)
	}
	add("SLO", slo)
	add("seed", fmt.Sprint(c.Seed))
	add("started", r.StartedAt.Format("2006-01-02 15:04:05 MST"))
	add("finished", r.FinishedAt.Format("2006-01-02 15:04:05 MST"))
	add("stop reason", r.StopReason)
	for _, t := range r.Targets {
		info := fmt.Sprintf("%s, model %s, metrics %s, prompt lengths by %s", t.URL, t.Model, orNone(t.MetricsURL), describeCalibration(t.Calibration))
		if t.PricePerHour > 0 {
			info += fmt.Sprintf("; priced at %s an hour: the run cost %s", fmtMoney(t.PricePerHour), fmtMoney(t.RunCost))
			if c := t.CostAtSafe; c != nil && c.PerMillionOutputTokens != nil {
				info += fmt.Sprintf(", %s per million output tokens at the safe level", fmtMoney(*c.PerMillionOutputTokens))
			}
		}
		if len(t.Notes) > 0 {
			info += "; " + strings.Join(t.Notes, "; ")
		}
		d.TargetInfo = append(d.TargetInfo, [2]string{t.Name, info})
	}
	return d
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #212121; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.answer { background: #fff; border-left: 5px solid #2e7d32; padding: 10px 14px; margin: 6px 0; font-size: 15px; }
.answer.none { border-left-color: #c62828; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 14px; }
svg.plot { width: 100%; height: auto; border: 1px solid #ddd; background: #fff; }
svg .ptitle { font-size: 14px; font-weight: 600; }
svg .grid line { stroke: #eee; }
svg .ytick { font-size: 11px; text-anchor: end; fill: #555; }
svg .xtick { font-size: 11px; text-anchor: middle; fill: #555; }
svg .xtitle, svg .ytitle { font-size: 12px; text-anchor: middle; fill: #333; }
svg .frame { fill: none; stroke: #999; }
svg .series { stroke-width: 2; }
svg .ref { stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .reflabel { font-size: 11px; text-anchor: end; }
svg .safelabel { font-size: 11px; font-weight: 600; }
svg .legend { font-size: 12px; }
svg .empty { font-size: 14px; fill: #777; }
table { border-collapse: collapse; background: #fff; font-size: 12.5px; }
th, td { border: 1px solid #ddd; padding: 3px 4px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; white-space: normal; vertical-align: bottom; font-size: 12px; }
td.name { text-align: left; white-space: normal; max-width: 9em; }
tr.why td { text-align: left; white-space: normal; color: #444; font-size: 12px; border-top: none; padding-left: 1.5em; }
tr.step.has-why td { border-bottom: none; }
.ci { color: #666; font-size: 11px; }
ul.errors { font-size: 13px; }
tr.safe td.verdict { color: #2e7d32; font-weight: 600; }
tr.unsafe td.verdict { color: #c62828; font-weight: 600; }
tr.inconclusive td.verdict { color: #ef6c00; font-weight: 600; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 14px; font-size: 13px; }
dt { font-weight: 600; }
dd { margin: 0; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
{{range .Answer}}<p class="answer{{if not $.Report.HasSafe}} none{{end}}">{{.}}</p>
{{end}}
<h2>Plots</h2>
<div class="plots">
{{range .Plots}}{{.}}
{{end}}</div>
<h2>Steps</h2>
<table id="steps">
<thead><tr>{{if .Multi}}<th>target</th>{{end}}<th>{{.LevelName}}</th><th>runs</th><th>req/s</th><th>out tok/s</th><th>TTFT p50</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p99</th><th>e2e p50</th><th>e2e p99</th><th>ok</th><th>429</th><th>failed</th><th>oom</th><th>KV peak</th><th>preempt</th><th>SLO met</th>{{if .Priced}}<th>cost / M out tok</th><th>run cost</th>{{end}}<th>verdict</th></tr></thead>
<tbody>
{{range .Rows}}<tr class="step {{.Class}}{{if .Reasons}} has-why{{end}}">{{if $.Multi}}<td class="name">{{.Step.Target}}</td>{{end}}<td>{{.Level}}</td><td>{{.Step.Attempts}}</td><td>{{printf "%.2f" .Step.RequestsPerS}}</td><td>{{printf "%.0f" .Step.OutputTokensPerS}}</td><td>{{.TTFT50}}</td><td>{{.TTFT99}}</td><td>{{.ITL50}}</td><td>{{.ITL99}}</td><td>{{.E2E50}}</td><td>{{.E2E99}}</td><td>{{.Step.Requests.OK}}</td><td>{{.Step.Requests.Shed}}</td><td>{{.Step.Requests.Failed}}</td><td>{{.OOM}}</td><td>{{.KV}}</td><td>{{.Preempt}}</td><td>{{.SLO}}{{if .SLOCI}}<br><span class="ci">{{.SLOCI}}</span>{{end}}</td>{{if $.Priced}}<td>{{.CostMTok}}</td><td>{{.Cost}}</td>{{end}}<td class="verdict">{{.Step.Verdict}}</td></tr>
{{if .Reasons}}<tr class="why {{.Class}}"><td colspan="{{$.Columns}}">{{.Reasons}}</td></tr>
{{end}}{{end}}</tbody>
</table>
{{if .Errors}}<h2>Errors seen</h2>
<ul class="errors">{{range .Errors}}<li>{{.}}</li>{{end}}</ul>{{end}}
<h2>Targets</h2>
<dl>{{range .TargetInfo}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>{{end}}</dl>
<h2>Configuration</h2>
<dl>{{range .Config}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>{{end}}</dl>
</body>
</html>
`))
