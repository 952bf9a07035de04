package loadtest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/sim"
)

// startSim runs an in-process simulated vLLM server and returns its URL.
func startSim(t *testing.T, cfg sim.Config) (string, *sim.Server) {
	t.Helper()
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String(), s
}

// The workload of the sim tests: 1216 prompt + 64 output tokens, 80 KV
// blocks of 16 a request, on a 20 GiB card (about a thousand blocks once
// Llama-3-8B's weights are in): 8 requests fit under the 75% ceiling, 16 do
// not fit at all.
//
// Whether 16 requests overflow depends on their meeting in the server: the
// sim runs at 1/20 of real time, so that a request lasts about 60 ms —
// many times longer than a busy machine takes to start a step's workers —
// and the sweeps start at 2, which keeps them short.
const simPrompt, simOutput, simBlocksPerRequest = 1216, 64, 80

func simWorkload(t *testing.T) (Dist, Dist) {
	t.Helper()
	p, err := ParseDist(fmt.Sprintf("fixed:%d", simPrompt), nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := ParseDist(fmt.Sprintf("fixed:%d", simOutput), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, o
}

func simConfig(mode string) sim.Config {
	return sim.Config{GPUMemory: 20 << 30, OnOverflow: mode, TimeScale: 0.05, Seed: 1}
}

// checkSimGeometry fails loudly if the sim's defaults moved so far that the
// premise of these tests (8 fit under the ceiling, 16 overflow) is gone.
func checkSimGeometry(t *testing.T, s *sim.Server) int64 {
	t.Helper()
	n := s.Stats().NumGPUBlocks
	if 8*simBlocksPerRequest > int64(0.75*float64(n)) || 16*simBlocksPerRequest <= n {
		t.Fatalf("sim has %d KV blocks: 8 requests of %d blocks must fit under 75%% and 16 must not fit", n, simBlocksPerRequest)
	}
	return n
}

func fastConfig(t *testing.T, targets ...Target) Config {
	p, o := simWorkload(t)
	return Config{
		Targets: targets, PromptTokens: p, OutputTokens: o, Requests: 20,
		ScrapeInterval: 20 * time.Millisecond, Cooldown: 5 * time.Second, RequestTimeout: 20 * time.Second, MaxStepTime: 30 * time.Second,
	}
}

func stepAt(r *Report, target string, level float64) *StepReport {
	for i := range r.Steps {
		if r.Steps[i].Target == target && r.Steps[i].Level == level {
			return &r.Steps[i]
		}
	}
	return nil
}

func TestSweepAgainstOOMSimFindsTheStepBefore(t *testing.T) {
	url, s := startSim(t, simConfig(sim.OverflowOOM))
	checkSimGeometry(t, s)
	cfg := fastConfig(t, Target{Name: "sim", URL: url})
	cfg.Concurrency = []int{2, 4, 8, 16, 32}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.HasSafe || rep.Safe != 8 {
		t.Fatalf("safe %v %g, want 8\n%s", rep.HasSafe, rep.Safe, rep.Answer)
	}
	ff := rep.FirstFailure
	if ff == nil || ff.Level != 16 || !strings.Contains(strings.Join(ff.Reasons, ";"), "overflow") {
		t.Fatalf("first failure %+v, want 16 by overflow", ff)
	}
	if len(rep.Steps) != 4 || stepAt(rep, "sim", 32) != nil {
		t.Errorf("%d steps; the sweep should stop at its first failure", len(rep.Steps))
	}
	// All 16 start together, so the overflow may strike in the warm-up;
	// it counts against the step either way.
	bad := stepAt(rep, "sim", 16)
	if bad.Requests.Overflow+bad.Requests.WarmupOverflow == 0 || bad.Safe {
		t.Errorf("step 16: %+v", bad.Requests)
	}
	for _, l := range []float64{2, 4, 8} {
		st := stepAt(rep, "sim", l)
		if !st.Safe || st.Requests.OK != 20 || st.KV == nil || st.KV.PeakUsage <= 0 || st.KV.PeakUsage > 0.75 || st.TTFT.N != 20 || st.ITL.N == 0 {
			t.Errorf("step %g: safe %v ok %d kv %+v ttft n %d itl n %d", l, st.Safe, st.Requests.OK, st.KV, st.TTFT.N, st.ITL.N)
		}
		if st.MeanOutputTokens != simOutput || st.MeanPromptTokens < simPrompt {
			t.Errorf("step %g: mean output %g, mean prompt %g (the server's count, template included)", l, st.MeanOutputTokens, st.MeanPromptTokens)
		}
	}
	// KV grows with concurrency, and the answer says so.
	if k4, k8 := stepAt(rep, "sim", 4).KV.PeakUsage, stepAt(rep, "sim", 8).KV.PeakUsage; k8 <= k4 {
		t.Errorf("peak KV at 8 (%g) not above 4 (%g)", k8, k4)
	}
	if !strings.HasPrefix(rep.Answer, "Safe concurrency for sim: 8 — ") || !strings.Contains(rep.Answer, "It first breaks at 16: overflow") {
		t.Errorf("answer: %s", rep.Answer)
	}
	if c := rep.Targets[0].Calibration; c.Source != "tokenize" || c.MaxAbsError != 0 || !c.ChatOverheadKnown {
		t.Errorf("prompt calibration on the sim's /tokenize: %+v", c)
	}
}

func TestPreemptSimShowsPreemptions(t *testing.T) {
	// 256 output tokens make a request last long enough at 1/50 of real
	// time for 16 to meet in the server.
	pc := simConfig(sim.OverflowPreempt)
	pc.TimeScale = 0.02
	url, s := startSim(t, pc)
	checkSimGeometry(t, s)
	cfg := fastConfig(t, Target{Name: "sim", URL: url})
	// Prompts that all fit at once and outputs that then outgrow the pool:
	// 16 × 64 prompt blocks are admitted, 16 × 80 do not fit.
	cfg.PromptTokens, cfg.OutputTokens = fixed(1024), fixed(256)
	cfg.Concurrency = []int{4, 16}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	four, sixteen := stepAt(rep, "sim", 4), stepAt(rep, "sim", 16)
	if four == nil || sixteen == nil {
		t.Fatalf("steps: %+v", rep.Steps)
	}
	if four.KV.Preemptions != 0 || !four.Safe {
		t.Errorf("4: preemptions %g safe %v", four.KV.Preemptions, four.Safe)
	}
	// Over-admitted, the sim preempts rather than failing: every request
	// still succeeds, but the step is not safe (KV at the top of the pool).
	if sixteen.KV.Preemptions == 0 || sixteen.Requests.OK != 20 || sixteen.Requests.Overflow != 0 || sixteen.Safe {
		t.Errorf("16: preemptions %g ok %d overflow %d safe %v reasons %v", sixteen.KV.Preemptions, sixteen.Requests.OK,
			sixteen.Requests.Overflow, sixteen.Safe, sixteen.Reasons)
	}
	if sixteen.KV.PeakWaiting == 0 {
		t.Errorf("16: no waiting requests seen in the memory curve")
	}
	if s.Stats().Preemptions == 0 {
		t.Error("the sim itself counted no preemptions")
	}
	if !rep.HasSafe || rep.Safe != 4 {
		t.Errorf("safe %g", rep.Safe)
	}
}

func TestSearchAgainstOOMSim(t *testing.T) {
	url, s := startSim(t, simConfig(sim.OverflowOOM))
	checkSimGeometry(t, s)
	cfg := fastConfig(t, Target{Name: "sim", URL: url})
	cfg.Search, cfg.SearchMax, cfg.Concurrency = true, 64, []int{2}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := rep.Targets[0]
	if !tr.HasSafe || tr.FirstFailure == nil || tr.FirstFailure.Level != tr.Safe+1 || tr.Safe < 8 || tr.Safe >= 16 {
		t.Fatalf("safe %g first failure %+v; want one apart, in [8, 16)\n%s", tr.Safe, tr.FirstFailure, tr.StopReason)
	}
	if !strings.Contains(tr.StopReason, "bisected to within 1") {
		t.Errorf("stop reason %q", tr.StopReason)
	}
	var levels []float64
	for _, x := range tr.Trials {
		levels = append(levels, x.Level)
	}
	if len(levels) < 5 || !slices.Equal(levels[:4], []float64{2, 4, 8, 16}) {
		t.Errorf("trials %v: should double 2..16 then bisect", levels)
	}
	if st := stepAt(rep, "sim", 16); st == nil || st.Requests.Overflow+st.Requests.WarmupOverflow == 0 {
		t.Errorf("16 should overflow: %+v", st)
	}
	// The report lists the steps by level; the trials keep the search's order.
	distinct := slices.Compact(slices.Sorted(slices.Values(levels)))
	if !slices.IsSortedFunc(rep.Steps, func(a, b StepReport) int { return cmpFloat(a.Level, b.Level) }) || len(rep.Steps) != len(distinct) {
		t.Errorf("steps not by level, or not one per level: %d steps for %d levels", len(rep.Steps), len(distinct))
	}
}

func TestCompareAndRateAgainstSims(t *testing.T) {
	// Timing does not matter here (see the workload below): full speed.
	sc := simConfig(sim.OverflowOOM)
	sc.TimeScale = 0.01
	small, _ := startSim(t, sc)
	big := sim.Config{GPUMemory: 24 << 30, OnOverflow: sim.OverflowOOM, TimeScale: 0.01, Seed: 2}
	large, _ := startSim(t, big)
	cfg := fastConfig(t, Target{Name: "small", URL: small}, Target{Name: "large", URL: large + "/v1/"})
	// This tests compare and rate mode, not where the sim breaks: requests
	// of 8 blocks, so that even all 24 at once (a Poisson burst, or a busy
	// machine that lets them pile up) stay far under the ceiling.
	cfg.Rates, cfg.Warmup = []float64{50, 100}, 4
	cfg.PromptTokens, cfg.OutputTokens = fixed(64), fixed(64)
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != ModeRate || len(rep.Targets) != 2 || len(rep.Steps) != 4 {
		t.Fatalf("mode %s, %d targets, %d steps", rep.Mode, len(rep.Targets), len(rep.Steps))
	}
	for _, tr := range rep.Targets {
		if !tr.HasSafe || tr.Safe != 100 {
			t.Errorf("%s: safe %v %g (%s)", tr.Name, tr.HasSafe, tr.Safe, tr.Answer)
		}
	}
	if !rep.HasSafe || rep.Safe != 100 || strings.Count(rep.Answer, "\n") != 1 {
		t.Errorf("top level: %v %g\n%s", rep.HasSafe, rep.Safe, rep.Answer)
	}
	if st := stepAt(rep, "large", 100); st == nil || st.Rate != 100 || st.Requests.OK != 20 || st.Requests.Warmup != 4 {
		t.Errorf("large at 100/s: %+v", st)
	}
}
