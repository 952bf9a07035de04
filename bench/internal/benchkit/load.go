package benchkit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/loadtest"
)

// Load is one kvgate loadtest run.
type Load struct {
	Name       string // names its report and log files
	Target     string // base URL loaded
	MetricsURL string // the simulator's /metrics, for the KV curve; "none" for none
	Model      string
	Levels     string // --concurrency
	Requests   int    // counted requests a step
	// Warmup is --warmup: uncounted requests at the start of each step (0:
	// the load tester's default, one per client).
	Warmup  int
	Prompts string // file of prompt lengths, one a line
	// PromptTokens is --prompt-tokens as given (uniform:A-B, ...), instead
	// of Prompts' file.
	PromptTokens string
	Outputs      string // --output-tokens
	Seed         uint64
	Strict       bool // --strict-openai: let the simulator stop outputs early
	// SharedPrefix is --shared-prefix (a system prompt common to every
	// request, in tokens) and Turns --turns (multi-turn sessions); 0 none.
	SharedPrefix, Turns int
	// SessionContext is --session-context: the length distribution of a
	// session's first message; "" none.
	SessionContext string
	// Think is --think-time (wall time); 0 none.
	Think time.Duration
}

// Load runs kvgate loadtest as l says and reads its report, one Step a
// level.
func (k *Kit) Load(ctx context.Context, l Load) ([]Step, error) {
	report := k.Path(Slug(l.Name) + ".json")
	prompts := "file:" + l.Prompts
	if l.PromptTokens != "" {
		prompts = l.PromptTokens
	}
	args := []string{"loadtest", "--target", l.Target, "--metrics-url", l.MetricsURL, "--model", l.Model,
		"--concurrency", l.Levels, "--requests", strconv.Itoa(l.Requests), "--keep-going", "--no-saturation-stop",
		"--prompt-tokens", prompts, "--output-tokens", l.Outputs, "--seed", strconv.FormatUint(l.Seed, 10),
		"--max-kv-usage", "1", "--max-reruns", "0", "--scrape-interval", "250ms", "--request-timeout", "30m",
		"--progress", "none", "--json", report}
	if l.Warmup != 0 {
		args = append(args, "--warmup", strconv.Itoa(l.Warmup))
	}
	if l.Strict {
		args = append(args, "--strict-openai")
	}
	if l.SharedPrefix > 0 {
		args = append(args, "--shared-prefix", strconv.Itoa(l.SharedPrefix))
	}
	if l.Turns > 1 {
		args = append(args, "--turns", strconv.Itoa(l.Turns))
	}
	if l.Think > 0 {
		args = append(args, "--think-time", l.Think.String())
	}
	if l.SessionContext != "" {
		args = append(args, "--session-context", l.SessionContext)
	}
	cmd := exec.CommandContext(ctx, k.Bin, args...)
	logf, err := os.Create(k.Path(Slug(l.Name) + "-loadtest.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	fmt.Fprintf(os.Stderr, "%s at %s ...\n", l.Name, l.Levels)
	// Exit status 1 only says no level was "safe" by the load tester's
	// criteria; the figures are what a benchmark reads.
	if err := cmd.Run(); err != nil && cmd.ProcessState.ExitCode() != 1 {
		return nil, fmt.Errorf("%s: loadtest: %w (see %s)", l.Name, err, logf.Name())
	}
	return ReadReport(report)
}

// Step is one level of a load test, as its report gives it.
type Step struct {
	Level        int
	Goodput      float64 // output tokens/s of answered requests
	KVMean       float64 // real KV use over the saturated part (share of the pool)
	KVPeak       float64
	Overflow     float64 // the simulator's out-of-memory events
	Preemptions  float64
	PreemptedPct float64 // preemptions per answered request
	OK, Shed     int
	Failed       int // every other outcome
	Server5xx    int // of Failed: 5xx answers and error events
	Overflowed   int // of Failed: answers that carried an out-of-memory error
	Window       float64
	TTFTP90      float64 // ms, of answered streams
}

// ReadReport turns the load tester's JSON into steps.
func ReadReport(path string) ([]Step, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep struct {
		Steps []loadtest.StepReport `json:"steps"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var steps []Step
	for _, s := range rep.Steps {
		q := s.Requests
		st := Step{Level: s.Concurrency, Goodput: s.OutputTokensPerS, OK: q.OK, Shed: q.Shed, Window: s.WindowS,
			Failed: q.Failed() + q.WarmupOverflow + q.WarmupFailed, Server5xx: q.Server5xx, Overflowed: q.Overflow + q.WarmupOverflow}
		st.TTFTP90 = s.TTFT.P90
		if kv := s.KV; kv != nil {
			st.KVPeak, st.Overflow, st.Preemptions = kv.PeakUsage, kv.OOMEvents, kv.Preemptions
			st.KVMean = saturatedMean(kv.Curve)
		}
		if q.OK > 0 {
			st.PreemptedPct = 100 * st.Preemptions / float64(q.OK)
		}
		steps = append(steps, st)
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%s: no steps", path)
	}
	return steps, nil
}

// saturatedMean is the mean KV use over the middle of the step — from 20 %
// to 80 % of its time, past the ramp-up and before the last requests drain.
func saturatedMean(curve []loadtest.CurvePoint) float64 {
	if len(curve) == 0 {
		return 0
	}
	end := curve[len(curve)-1].T
	var sum float64
	n := 0
	for _, p := range curve {
		if p.T >= 0.2*end && p.T <= 0.8*end {
			sum += p.KVUsage
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// WritePromptLengths writes the benchmarks' prompt lengths to path, one a
// line, from seed: 90 % about 256 tokens (224–288), 10 % about 4000
// (3800–4200).
func WritePromptLengths(path string, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 1))
	var b strings.Builder
	for range 4096 {
		if r.IntN(10) == 0 {
			fmt.Fprintln(&b, 3800+r.IntN(401))
		} else {
			fmt.Fprintln(&b, 224+r.IntN(65))
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
