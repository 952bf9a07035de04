package loadtest

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// A small SVG plotter for the HTML report: line plots with markers, a log-2
// or linear x axis, horizontal reference lines (the ceiling, an SLO) and
// vertical markers (the safe level). Everything is inline, so the report
// needs no script, font or network to render.

type plotPoint struct {
	x, y    float64
	verdict string // "safe", "unsafe", "inconclusive" or "" (no marker)
	tip     string
}

type plotSeries struct {
	name   string
	color  string
	points []plotPoint
}

type refLine struct {
	at    float64
	label string
	color string
}

type plot struct {
	id       string
	title    string
	xTitle   string
	yTitle   string
	yFmt     func(float64) string
	xFmt     func(float64) string
	series   []plotSeries
	hlines   []refLine
	vlines   []refLine
	logX     bool
	xTicks   []float64 // nil: automatic
	yMin     float64
	yMax     float64 // 0: automatic
	noMarker bool
}

const (
	plotW, plotH                       = 560, 320
	padL, padR, padT, padB             = 64, 16, 36, 48
	innerW, innerH                     = plotW - padL - padR, plotH - padT - padB
	colorUnsafe, colorCeiling, colorOK = "#c62828", "#c62828", "#2e7d32"
)

var palette = []string{"#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"}

// render returns the plot as an <svg> element.
func (p *plot) render() string {
	var xs, ys []float64
	for _, s := range p.series {
		for _, pt := range s.points {
			if isFinite(pt.x) && isFinite(pt.y) {
				xs = append(xs, pt.x)
				ys = append(ys, pt.y)
			}
		}
	}
	for _, v := range p.vlines {
		xs = append(xs, v.at)
	}
	// Every level plot shares one x axis, data or not.
	xs = append(xs, p.xTicks...)
	for _, h := range p.hlines {
		ys = append(ys, h.at)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="%s" class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		esc(p.id), plotW, plotH, esc(p.title))
	fmt.Fprintf(&b, `<title>%s</title>`, esc(p.title))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="#fff"/>`, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="20" class="ptitle">%s</text>`, padL, esc(p.title))
	if len(xs) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="empty">no data</text></svg>`, plotW/2-30, plotH/2)
		return b.String()
	}
	xmin, xmax := slices.Min(xs), slices.Max(xs)
	logX := p.logX && xmin > 0
	tx := func(x float64) float64 { return x }
	if logX {
		tx = math.Log2
	}
	x0, x1 := tx(xmin), tx(xmax)
	if x1-x0 < 1e-12 {
		x0, x1 = x0-1, x1+1
	} else {
		pad := (x1 - x0) * 0.04
		x0, x1 = x0-pad, x1+pad
	}
	ymin, ymax := p.yMin, p.yMax
	if ymax == 0 {
		ymax = niceCeil(max(slices.Max(ys)*1.08, ymin+1e-9))
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	sx := func(x float64) float64 { return padL + (tx(x)-x0)/(x1-x0)*innerW }
	sy := func(y float64) float64 {
		return padT + innerH - (min(max(y, ymin), ymax)-ymin)/(ymax-ymin)*innerH
	}
	xf, yf := p.xFmt, p.yFmt
	if xf == nil {
		xf = fmtLevel
	}
	if yf == nil {
		yf = func(v float64) string { return trimFloat(v) }
	}

	// Grid and axes.
	b.WriteString(`<g class="grid">`)
	for _, t := range niceTicks(ymin, ymax, 5) {
		y := sy(t)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padL, padL+innerW, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="ytick">%s</text>`, padL-6, y+4, esc(yf(t)))
	}
	xticks := p.xTicks
	if xticks == nil {
		xticks = niceTicks(xmin, xmax, 6)
	}
	xticks = thinTicks(xticks, sx, 34)
	for _, t := range xticks {
		x := sx(t)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d"/>`, x, x, padT, padT+innerH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="xtick">%s</text>`, x, padT+innerH+16, esc(xf(t)))
	}
	b.WriteString(`</g>`)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" class="frame"/>`, padL, padT, innerW, innerH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="xtitle">%s</text>`, padL+innerW/2, plotH-8, esc(p.xTitle))
	fmt.Fprintf(&b, `<text transform="translate(14 %d) rotate(-90)" class="ytitle">%s</text>`, padT+innerH/2, esc(p.yTitle))

	// Reference lines.
	for _, h := range p.hlines {
		y := sy(h.at)
		fmt.Fprintf(&b, `<line class="ref" x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`, padL, padL+innerW, y, y, h.color)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="reflabel" fill="%s">%s</text>`, padL+innerW-4, y-4, h.color, esc(h.label))
	}
	for i, v := range p.vlines {
		x := sx(v.at)
		fmt.Fprintf(&b, `<line class="ref safe" x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s"/>`, x, x, padT, padT+innerH, v.color)
		lx, anchor := x+4, "start"
		if x > padL+innerW*0.65 { // keep the label inside the frame
			lx, anchor = x-4, "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="safelabel" fill="%s" text-anchor="%s">%s</text>`, lx, padT+12+14*i, v.color, anchor, esc(v.label))
	}

	// Series.
	for _, s := range p.series {
		var pts []string
		for _, pt := range s.points {
			if isFinite(pt.x) && isFinite(pt.y) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(pt.x), sy(pt.y)))
			}
		}
		if len(pts) > 0 {
			fmt.Fprintf(&b, `<polyline class="series" fill="none" stroke="%s" points="%s"/>`, s.color, strings.Join(pts, " "))
		}
		if p.noMarker {
			continue
		}
		for _, pt := range s.points {
			if !isFinite(pt.x) || !isFinite(pt.y) {
				continue
			}
			x, y := sx(pt.x), sy(pt.y)
			switch pt.verdict {
			case "unsafe":
				fmt.Fprintf(&b, `<g class="marker unsafe"><title>%s</title><path d="M%.1f %.1fl8 8m0 -8l-8 8" stroke="%s" stroke-width="2.5"/></g>`,
					esc(pt.tip), x-4, y-4, colorUnsafe)
			case "inconclusive":
				fmt.Fprintf(&b, `<circle class="marker unsure" cx="%.1f" cy="%.1f" r="4.5" fill="#fff" stroke="%s" stroke-width="2"><title>%s</title></circle>`,
					x, y, s.color, esc(pt.tip))
			default:
				fmt.Fprintf(&b, `<circle class="marker safe" cx="%.1f" cy="%.1f" r="4.5" fill="%s"><title>%s</title></circle>`,
					x, y, s.color, esc(pt.tip))
			}
		}
	}

	// Legend.
	lx := padL + 8
	for _, s := range p.series {
		if len(p.series) < 2 {
			break
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" class="legend">%s</text>`,
			lx, padT+6, s.color, lx+14, padT+15, esc(s.name))
		lx += 24 + 7*len(s.name)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 || !isFinite(v) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v*(1-1e-12) {
			return m * e
		}
	}
	return 10 * e
}

// niceTicks are about n round values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		return []float64{lo}
	}
	step := niceCeil((hi - lo) / float64(n))
	var out []float64
	for t := math.Ceil(lo/step-1e-9) * step; t <= hi+step*1e-9; t += step {
		v := math.Round(t/step) * step
		if math.Abs(v) < step*1e-9 {
			v = 0 // never "-0"
		}
		out = append(out, v)
	}
	return out
}

// thinTicks drops ticks closer than gap pixels to the last one kept.
func thinTicks(ts []float64, sx func(float64) float64, gap float64) []float64 {
	var out []float64
	last := math.Inf(-1)
	for _, t := range ts {
		if x := sx(t); x-last >= gap {
			out = append(out, t)
			last = x
		}
	}
	return out
}

func trimFloat(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0")
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func esc(s string) string { return html.EscapeString(s) }
