package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// header is what the table says about how it was measured.
type header struct {
	machine     string
	load        string
	started     time.Time
	notes       []string
	shortTokens int
	longTokens  int
	maxTokens   int
	rounds      int
	duration    time.Duration
}

func writeTable(out io.Writer, h header, cells []*cell) {
	floor := len(cells) > 0 && len(cells[0].result) > 3
	if floor {
		fmt.Fprintf(out, "direct, nginx, fasthttp (a bare fasthttp reverse proxy, the library's floor) and kvgate in front of the same instant backend (kvgate sim --time-scale 0), %s\n", h.started.UTC().Format("2006-01-02 15:04 MST"))
	} else {
		fmt.Fprintf(out, "direct, nginx and kvgate in front of the same instant backend (kvgate sim --time-scale 0), %s\n", h.started.UTC().Format("2006-01-02 15:04 MST"))
	}
	fmt.Fprintf(out, "machine: %s; load average %s before the run\n", h.machine, h.load)
	for _, n := range h.notes {
		fmt.Fprintln(out, n)
	}
	fmt.Fprintf(out, "prompts: short %d tokens, long %d tokens; %d output tokens; %d rounds × %s measured per row and target\n",
		h.shortTokens, h.longTokens, h.maxTokens, h.rounds, h.duration)
	fmt.Fprintln(out, "latency to the last byte; +p50 and +p99 are the proxy's percentile minus direct's in the same row")
	if floor {
		fmt.Fprintln(out, "fasthttp/nginx is what the library costs against nginx; kvgate/fasthttp what the gateway's own work costs on top of it")
	}
	fmt.Fprintln(out)

	// The proxies' blocks, by index into cell.result: nginx, the floor
	// beside it when measured, kvgate.
	proxies := []int{1, 2}
	if floor {
		proxies = []int{1, 3, 2}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	title, cols := "\t\t\tdirect\t\t", "conns\tstream\tprompt\treq/s\tp50\tp99"
	for _, i := range proxies {
		title += "\t" + targetNames[i] + "\t\t"
		cols += "\treq/s\t+p50\t+p99"
	}
	title += "\tkvgate/nginx\t"
	cols += "\t+p50\treq/s"
	if floor {
		title += "\tfasthttp/nginx\tkvgate/fasthttp"
		cols += "\treq/s\treq/s"
	}
	fmt.Fprintln(tw, title+"\t")
	fmt.Fprintln(tw, cols+"\t")
	for _, c := range cells {
		d := &c.result[0]
		d50, d99 := percentile(d.lat, 0.50), percentile(d.lat, 0.99)
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s", c.rowKey(), d.rps(), fmtDur(d50), fmtDur(d99))
		added := make([]time.Duration, len(c.result)) // +p50 by target
		for _, i := range proxies {
			s := &c.result[i]
			added[i] = percentile(s.lat, 0.50) - d50
			fmt.Fprintf(tw, "\t%.0f\t%s\t%s", s.rps(), fmtDur(added[i]), fmtDur(percentile(s.lat, 0.99)-d99))
		}
		n, k := &c.result[1], &c.result[2]
		fmt.Fprintf(tw, "\t%s\t%s", ratio(float64(added[2]), float64(added[1])), ratio(k.rps(), n.rps()))
		if floor {
			f := &c.result[3]
			fmt.Fprintf(tw, "\t%s\t%s", ratio(f.rps(), n.rps()), ratio(k.rps(), f.rps()))
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
	writeCPU(out, cells, proxies)
}

// writeCPU prints, when any server's processes were measured, the CPU
// time each spent per request: the backend's own (direct) and each
// proxy's own. On shared cores this is what the throughput ratios follow.
func writeCPU(out io.Writer, cells []*cell, proxies []int) {
	measured := false
	for _, c := range cells {
		for i := range c.result {
			measured = measured || c.result[i].ended > 0
		}
	}
	if !measured {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "CPU time per request: user + system of each server's processes (with their children, as nginx's workers) over the measured windows; direct is the backend's own")
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := "conns\tstream\tprompt\tdirect"
	for _, i := range proxies {
		cols += "\t" + targetNames[i]
	}
	cols += "\tkvgate/nginx"
	floor := slices.Contains(proxies, 3)
	if floor {
		cols += "\tkvgate/fasthttp"
	}
	fmt.Fprintln(tw, cols+"\t")
	cpu := func(s *sample) string {
		if d := s.cpuPerRequest(); d > 0 {
			return fmtDur(d)
		}
		return "-"
	}
	for _, c := range cells {
		fmt.Fprintf(tw, "%s\t%s", c.rowKey(), cpu(&c.result[0]))
		for _, i := range proxies {
			fmt.Fprintf(tw, "\t%s", cpu(&c.result[i]))
		}
		k := float64(c.result[2].cpuPerRequest())
		fmt.Fprintf(tw, "\t%s", ratio(k, float64(c.result[1].cpuPerRequest())))
		if floor {
			fmt.Fprintf(tw, "\t%s", ratio(k, float64(c.result[3].cpuPerRequest())))
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
}

// rowKey is the columns that name c's row in both tables: connections,
// streamed or not, prompt.
func (c *cell) rowKey() string {
	stream := "no"
	if c.w.stream {
		stream = "yes"
	}
	return fmt.Sprintf("%d\t%s\t%s", c.conns, stream, c.label)
}

// percentile is the nearest-rank p-quantile of d (sorted in place); 0 for
// no samples.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d))*p+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// ratio is a/b as "1.23×", or "-" when b is not positive (an added latency
// within the noise).
func ratio(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func fmtDur(d time.Duration) string {
	switch a := d.Abs(); {
	case a < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case a < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case a < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// machine describes where the run happened: CPU model and count, OS and
// kernel, Go version.
func machine() string {
	osName := runtime.GOOS
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		osName += " " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d CPUs, %s, %s", cmp.Or(benchkit.CPUModel(), "unknown CPU"), runtime.NumCPU(), osName, runtime.Version())
}
