package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/backends/gpuinfo"
	"github.com/kvgate/kvgate/kvbudget"
)

// planGPU is one row of the plan: a GPU and what it holds for this model.
type planGPU struct {
	Name           string `json:"name"`
	MemoryBytes    int64  `json:"memory_bytes"`
	Fits           bool   `json:"fits"`
	KVBudgetBytes  int64  `json:"kv_budget_bytes"`
	Blocks         int64  `json:"blocks"`
	Tokens         int64  `json:"tokens"`
	MaxConcurrency int64  `json:"max_concurrency"`

	// At max_concurrency: the memory-bandwidth bound of decoding (tokens/s
	// of one replica of tp GPUs), and with --price its cost.
	BandwidthBytesPerS  float64  `json:"bandwidth_bytes_per_second,omitempty"`
	DecodeTokensPerS    float64  `json:"decode_tokens_per_second_bound,omitempty"`
	PricePerHour        float64  `json:"price_per_hour,omitempty"` // per GPU
	CostPerMillionToken *float64 `json:"cost_per_million_tokens,omitempty"`
	// CostRank is 1 for the cheapest per token among the priced GPUs that
	// fit; 0 when not ranked.
	CostRank int `json:"cost_rank,omitempty"`
}

// planReport is the --json output of kvgate plan. The top-level figures are
// for the GPU given by --gpu-memory; gpus is the same plan over common cards.
type planReport struct {
	Model             kvReport  `json:"model"`
	GPUMemoryBytes    int64     `json:"gpu_memory_bytes"`
	GPUMemoryReadAs   string    `json:"gpu_memory_read_as"`
	Utilization       float64   `json:"utilization"`
	ReserveBytes      int64     `json:"reserve_bytes"`
	OtherUsedBytes    int64     `json:"other_used_bytes"`
	WeightBytesPerGPU int64     `json:"weight_bytes_per_gpu"`
	Context           int       `json:"context"`
	Fits              bool      `json:"fits"`
	Problem           string    `json:"problem,omitempty"`
	MinTP             int       `json:"min_tp_that_fits,omitempty"` // when it does not fit: the smallest larger tp that does
	KVBudgetBytes     int64     `json:"kv_budget_bytes"`
	Blocks            int64     `json:"blocks"`
	Tokens            int64     `json:"tokens"`
	MaxConcurrency    int64     `json:"max_concurrency"`
	GPUs              []planGPU `json:"gpus"`
}

// planGPUFor computes one GPU's row.
func planGPUFor(name string, mem int64, r *planReport, l kvbudget.KVLayout) (planGPU, error) {
	g := kvbudget.GPUBudget{Memory: mem, Ceiling: r.Utilization, Weights: r.WeightBytesPerGPU, Reserve: r.ReserveBytes, OtherUsed: r.OtherUsedBytes}
	row := planGPU{Name: name, MemoryBytes: mem}
	kv, err := g.KVBytes()
	if err != nil {
		return row, err
	}
	c := l.CapacityOf(kv)
	row.Fits, row.KVBudgetBytes, row.Blocks, row.Tokens = true, c.Bytes, c.Blocks, c.Tokens
	row.MaxConcurrency = l.MaxConcurrency(c, r.Context)
	return row, nil
}

func runPlan(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("plan", "--model-config PATH [--gpu-memory 24GiB] [--context 8192] [--tp N] [--utilization 0.75] [--price GPU=PRICE/h,...] [--json]", stdout, stderr)
	var mf modelFlags
	mf.register(fs)
	var reserve, other sizeFlag
	gpuMem := sizeFlag{gpu: true}
	fs.Var(&gpuMem, "gpu-memory", "memory of one GPU: 80GiB, 80GB (decimal), 24G (read as GiB); default: read from the local GPU through NVML")
	fs.Var(&reserve, "reserve", "activation and runtime memory kept per GPU (vLLM's profiled activation peak, CUDA graphs, non-torch allocations) (default 1GiB)")
	fs.Var(&other, "other-used", "memory used on each GPU by other processes (default 0)")
	util := fs.Float64("utilization", kvbudget.DefaultCeiling, "ceiling: fraction of GPU memory that weights + KV cache may reach, in (0, 1]")
	contextLen := fs.Int("context", 4096, "tokens per request (prompt + output) for the concurrency figures")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	priceList := fs.String("price", "", "price per GPU per hour, `GPU=PRICE/h,...` (e.g. a100-80gb=2.10/h,l4=0.80/h,h100=4.50/h; any currency): ranks the common GPUs that fit by cost per million tokens at their planned concurrency")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	if *util <= 0 || *util > 1 {
		return fail(stderr, "plan", exitUsage, "--utilization must be in (0, 1], got %g", *util)
	}
	if *contextLen < 1 {
		return fail(stderr, "plan", exitUsage, "--context must be >= 1 token, got %d", *contextLen)
	}
	mr, _, layout, err := mf.resolve()
	if err != nil {
		return fail(stderr, "plan", exitUsage, "%v", err)
	}
	if !mr.weightsKnown() {
		return fail(stderr, "plan", exitUsage, "--model-config %s: the weight estimate needs %s, which the config lacks; add it to the config or pass --weights-bytes (the model's weight bytes, e.g. 16GB)",
			mf.config, strings.Join(mr.WeightsUnknown, " and "))
	}
	prices, err := parseGPUPrices(*priceList, kvbudget.CommonGPUs())
	if err != nil {
		return fail(stderr, "plan", exitUsage, "--price: %v", err)
	}
	r := planReport{
		Model: mr, Utilization: *util, ReserveBytes: kvbudget.DefaultReserve,
		WeightBytesPerGPU: mr.WeightBytesPerGPU, Context: *contextLen,
	}
	if reserve.set {
		r.ReserveBytes = reserve.size.Bytes
	}
	if other.set {
		r.OtherUsedBytes = other.size.Bytes
	}
	gpuName := ""
	if gpuMem.set {
		r.GPUMemoryBytes, r.GPUMemoryReadAs = gpuMem.size.Bytes, gpuMem.size.Unit
	} else {
		devs, err := gpuinfo.Probe()
		if err != nil {
			hint := ""
			if errors.Is(err, gpuinfo.ErrNoGPU) {
				hint = "; pass --gpu-memory, e.g. --gpu-memory 24GiB"
			}
			return fail(stderr, "plan", exitUsage, "--gpu-memory not given and no local GPU to read it from (%v)%s", err, hint)
		}
		d := devs[0]
		r.GPUMemoryBytes, r.GPUMemoryReadAs, gpuName = d.Total, "bytes, from NVML", fmt.Sprintf("GPU 0 (%s)", d.Name)
		// Memory already held on the card belongs to someone else.
		if !other.set {
			r.OtherUsedBytes = d.Used
		}
	}
	mine, err := planGPUFor(gpuName, r.GPUMemoryBytes, &r, layout)
	switch {
	case errors.Is(err, kvbudget.ErrWeightsDoNotFit):
		r.Problem = err.Error()
	case err != nil:
		return fail(stderr, "plan", exitUsage, "%v", err)
	}
	if !mine.Fits {
		r.MinTP = minTPThatFits(&mf, r)
	}
	r.Fits, r.KVBudgetBytes, r.Blocks, r.Tokens, r.MaxConcurrency = mine.Fits, mine.KVBudgetBytes, mine.Blocks, mine.Tokens, mine.MaxConcurrency
	for _, g := range kvbudget.CommonGPUs() {
		row, err := planGPUFor(g.Name, g.Memory, &r, layout)
		if err != nil && !errors.Is(err, kvbudget.ErrWeightsDoNotFit) {
			return fail(stderr, "plan", exitUsage, "%v", err)
		}
		row.BandwidthBytesPerS = g.Bandwidth
		if row.Fits {
			kvPerSeq := int64(r.Context) * layout.BytesPerToken
			row.DecodeTokensPerS = kvbudget.DecodeBound(g.Bandwidth, r.WeightBytesPerGPU, kvPerSeq, row.MaxConcurrency)
		}
		if p, ok := prices[g.Name]; ok {
			row.PricePerHour = p
			if row.DecodeTokensPerS > 0 {
				c := p * float64(mr.TP) / (row.DecodeTokensPerS * 3600) * 1e6
				row.CostPerMillionToken = &c
			}
		}
		r.GPUs = append(r.GPUs, row)
	}
	rankByCost(r.GPUs)

	code := exitOK
	if !r.Fits {
		code = exitNo
	}
	if *asJSON {
		if c := writeJSON(stdout, stderr, "plan", r); c != exitOK {
			return c
		}
		return code
	}
	printPlan(stdout, &r, gpuMem.raw, gpuName)
	return code
}

func printPlan(w io.Writer, r *planReport, raw, gpuName string) {
	m := r.Model
	params := "params unknown"
	if m.Params > 0 {
		params = fmt.Sprintf("%.2f B params", float64(m.Params)/1e9)
	}
	fmt.Fprintf(w, "Model:  %s (%s rules), %s, %s of weights %s\n",
		m.ModelConfig, m.Family, params, kvbudget.FormatBytes(m.WeightBytes), weightsSource(m.WeightDType))
	fmt.Fprintf(w, "KV:     %s per token, %s per block of %d tokens, %s cache, on each of %d GPU(s)\n",
		kvbudget.FormatBytes(m.BytesPerToken), kvbudget.FormatBytes(m.BytesPerBlock), m.BlockSize, m.KVDType, m.TP)
	if gpuName != "" {
		fmt.Fprintf(w, "GPU:    %s, %s (%d bytes, read from NVML)\n", gpuName, kvbudget.FormatBytes(r.GPUMemoryBytes), r.GPUMemoryBytes)
	} else {
		fmt.Fprintf(w, "GPU:    %q read as %s: %s (%d bytes)\n", raw, r.GPUMemoryReadAs, kvbudget.FormatBytes(r.GPUMemoryBytes), r.GPUMemoryBytes)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	usable := int64(float64(r.GPUMemoryBytes) * r.Utilization)
	fmt.Fprintf(tw, "usable at ceiling %.2f\t%s\t\n", r.Utilization, kvbudget.FormatBytes(usable))
	fmt.Fprintf(tw, "- weights per GPU\t%s\t\n", kvbudget.FormatBytes(r.WeightBytesPerGPU))
	fmt.Fprintf(tw, "- reserve\t%s\t\n", kvbudget.FormatBytes(r.ReserveBytes))
	if r.OtherUsedBytes > 0 {
		fmt.Fprintf(tw, "- used by others\t%s\t\n", kvbudget.FormatBytes(r.OtherUsedBytes))
	}
	if r.Fits {
		fmt.Fprintf(tw, "= KV budget per GPU\t%s\t\n", kvbudget.FormatBytes(r.KVBudgetBytes))
		fmt.Fprintf(tw, "blocks\t%d\t\n", r.Blocks)
		fmt.Fprintf(tw, "tokens in cache\t%d\t\n", r.Tokens)
		fmt.Fprintf(tw, "max concurrent sequences of %d tokens\t%d\t\n", r.Context, r.MaxConcurrency)
	}
	tw.Flush()
	if !r.Fits {
		fmt.Fprintf(w, "\nDOES NOT FIT: %s.\n", r.Problem)
		if r.MinTP > 0 {
			fmt.Fprintf(w, "It fits with --tp %d (the weights split over %d GPUs of this size).\n", r.MinTP, r.MinTP)
		}
	} else if r.MaxConcurrency == 0 {
		fmt.Fprintf(w, "\nThe weights fit, but not one sequence of %d tokens does: %d tokens of cache in all.\n", r.Context, r.Tokens)
	}
	priced := false
	for _, g := range r.GPUs {
		priced = priced || g.PricePerHour > 0
	}
	order := r.GPUs
	if priced {
		order = byCostRank(r.GPUs)
	}
	fmt.Fprintf(w, "\nCommon GPUs (tp %d, ceiling %.2f, reserve %s, context %d):\n", m.TP, r.Utilization, kvbudget.FormatBytes(r.ReserveBytes), r.Context)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "GPU\tmemory\tfits\tKV budget\ttokens\tconcurrency")
	if priced {
		fmt.Fprint(tw, "\ttok/s bound\tprice/h\tcost/Mtok\trank")
	}
	fmt.Fprintln(tw)
	for _, g := range order {
		fits := "yes"
		if !g.Fits {
			fits = "no"
		} else if g.MaxConcurrency == 0 {
			fits = "weights only"
		}
		budget, tokens, conc := "-", "-", "-"
		if g.Fits {
			budget, tokens, conc = kvbudget.FormatBytes(g.KVBudgetBytes), groupDigits(g.Tokens), groupDigits(g.MaxConcurrency)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s", g.Name, kvbudget.FormatBytes(g.MemoryBytes), fits, budget, tokens, conc)
		if priced {
			tps, price, cost, rank := "-", "-", "-", "-"
			if g.DecodeTokensPerS > 0 {
				tps = groupDigits(int64(g.DecodeTokensPerS))
			}
			if g.PricePerHour > 0 {
				price = fmt.Sprintf("%.2f", g.PricePerHour)
			}
			if g.CostPerMillionToken != nil {
				cost = fmt.Sprintf("%.3f", *g.CostPerMillionToken)
			}
			if g.CostRank > 0 {
				rank = fmt.Sprint(g.CostRank)
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s", tps, price, cost, rank)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	if priced {
		fmt.Fprintf(w, "\nCost per million output tokens at each GPU's planned concurrency, tp %d GPU(s) per replica, from the\n"+
			"memory-bandwidth bound of decoding (every step reads the weights and each sequence's %d-token KV once);\n"+
			"real servers reach roughly 50–80%% of that bound, alike across GPUs, so the ranking holds better than the figures.\n", m.TP, r.Context)
	}
}

// parseGPUPrices reads GPU=PRICE/h,... naming GPUs of gpus by their name
// without spaces or dashes, case aside ("a100-80gb", "H100 80GB"), or by
// the model alone when only one size has it ("h100", "l40s"; "a100" is
// ambiguous).
func parseGPUPrices(s string, gpus []kvbudget.GPU) (map[string]float64, error) {
	out := map[string]float64{}
	if s == "" {
		return out, nil
	}
	norm := func(x string) string {
		var b strings.Builder
		for _, c := range strings.ToLower(x) {
			if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
				b.WriteRune(c)
			}
		}
		return b.String()
	}
	for item := range strings.SplitSeq(s, ",") {
		name, p, ok := strings.Cut(item, "=")
		if !ok || norm(name) == "" {
			return nil, fmt.Errorf("want GPU=PRICE/h,... (e.g. a100-80gb=2.10/h), got %q", item)
		}
		price, err := parsePrice(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", strings.TrimSpace(name), err)
		}
		key := norm(name)
		var match []string
		for _, g := range gpus {
			model := g.Name[:strings.LastIndexByte(g.Name, ' ')]
			if norm(g.Name) == key {
				match = []string{g.Name}
				break
			}
			if norm(model) == key {
				match = append(match, g.Name)
			}
		}
		switch len(match) {
		case 0:
			var names []string
			for _, g := range gpus {
				names = append(names, g.Name)
			}
			return nil, fmt.Errorf("%q is none of the common GPUs (%s)", strings.TrimSpace(name), strings.Join(names, ", "))
		case 1:
			if _, dup := out[match[0]]; dup {
				return nil, fmt.Errorf("%s is priced twice", match[0])
			}
			out[match[0]] = price
		default:
			return nil, fmt.Errorf("%q could be %s: add the memory (e.g. %s)", strings.TrimSpace(name), strings.Join(match, " or "), strings.ToLower(strings.ReplaceAll(match[0], " ", "-")))
		}
	}
	return out, nil
}

// rankByCost numbers the priced rows that have a cost, cheapest per token
// first.
func rankByCost(gpus []planGPU) {
	ranked := byCostRank(gpus)
	n := 0
	for _, g := range ranked {
		if g.CostPerMillionToken == nil {
			break
		}
		n++
		for i := range gpus {
			if gpus[i].Name == g.Name {
				gpus[i].CostRank = n
			}
		}
	}
}

// byCostRank is gpus with the costed rows first, cheapest per token first,
// then the others in their order.
func byCostRank(gpus []planGPU) []planGPU {
	out := slices.Clone(gpus)
	slices.SortStableFunc(out, func(a, b planGPU) int {
		switch {
		case a.CostPerMillionToken == nil && b.CostPerMillionToken == nil:
			return 0
		case a.CostPerMillionToken == nil:
			return 1
		case b.CostPerMillionToken == nil:
			return -1
		}
		return cmp.Compare(*a.CostPerMillionToken, *b.CostPerMillionToken)
	})
	return out
}

// groupDigits writes n with thousands separators.
func groupDigits(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + groupDigits(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// minTPThatFits is the smallest tensor-parallel size above the current one,
// up to 16, at which the model holds at least one sequence of the plan's
// context on GPUs of the plan's size; 0 if none does.
func minTPThatFits(mf *modelFlags, r planReport) int {
	for tp := mf.tp * 2; tp <= 16; tp *= 2 {
		try := *mf
		try.tp = tp
		mr, _, l, err := try.resolve()
		if err != nil {
			continue
		}
		r.WeightBytesPerGPU = mr.WeightBytesPerGPU
		if row, err := planGPUFor("", r.GPUMemoryBytes, &r, l); err == nil && row.MaxConcurrency > 0 {
			return tp
		}
	}
	return 0
}

// weightsSource says where the weight bytes come from, for the plan's first
// line: "in bfloat16", or "as given by --weights-bytes".
func weightsSource(dtype string) string {
	if strings.HasPrefix(dtype, "as given") {
		return dtype
	}
	return "in " + dtype
}
