package main

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func (b *bench) row(cols ...string) { b.rows = append(b.rows, cols) }

func (b *bench) note(format string, args ...any) {
	b.notes = append(b.notes, fmt.Sprintf(format, args...))
}

func (b *bench) check(ok bool, format string, args ...any) {
	b.verdicts = append(b.verdicts, verdict{ok, fmt.Sprintf(format, args...)})
}

func (b *bench) print() {
	o := b.o
	fmt.Printf("shared-budget: three kvgate replicas sharing one simulated GPU through Redis, against one gateway with the in-process budget\n")
	fmt.Printf("machine: %s, %d CPUs, %s/%s, %s; %s\n", cmp.Or(benchkit.CPUModel(), runtime.GOARCH), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), b.redisVersion)
	fmt.Printf("GPU: simulated Llama-3-8B on 24 GiB, pool at the 0.75 ceiling = budget %d blocks (%.0f MiB), --on-overflow oom, time scale %g\n",
		b.budgetBlocks, float64(b.budgetBlocks*b.blockBytes)/(1<<20), o.timeScale)
	fmt.Printf("load: %d closed-loop clients, ~%d-token prompts, max_tokens %d, outputs %s; warm-up %v, measured %v; reservation %s; lease_ttl 3s, chunk 2%%\n\n",
		o.clients, o.promptTokens, o.maxTokens, o.outputLen, o.warmup, o.measure, o.reservation)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "phase\ttarget\tok\t429\tfailed\toom\tKV mean\tKV peak\tnotes")
	for _, r := range b.rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
	fmt.Println()
	for _, v := range b.verdicts {
		mark := "PASS"
		if !v.ok {
			mark = "FAIL"
		}
		fmt.Printf("%s  %s\n", mark, v.text)
	}
	for _, n := range b.notes {
		fmt.Printf("NOTE  %s\n", n)
	}
}
