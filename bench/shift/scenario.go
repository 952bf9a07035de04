package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// scenario is one traffic shape. Its functions see the client's index, the
// time since the start and a random source of the client's own.
type scenario struct {
	name, title string
	reservation string // "" = --reservation
	outputLen   string // the simulator's short distribution; "" = lognormal:50,0.8
	tenants     string // the gateway's tenants section ("" = none)
	tenantOf    func(client int) string
	long        func(client int, t time.Duration, r *rand.Rand) bool
	minTokens   func(client int, r *rand.Rand) int
	noStream    func(client int, r *rand.Rand) bool
	hangupAt    time.Duration // 0: none
	hangups     int
	// The two-tenant scenario: each client's max_tokens (nil: maxTokens),
	// the client that sends from the change on only (nil: every one from
	// the start), the simulator's overflow mode ("" = oom) and whether the
	// clients talk to the simulator alone, without the gateway.
	maxTokens  func(client int) int
	joinsLate  func(client int) bool
	onOverflow string
	direct     bool
	// fromStart: the traffic departs from its history from the start (a
	// ramp, a field, a heavy tail), so requests count from there.
	fromStart bool
	// simArgs are the simulator's further flags (merged stream events,
	// --no-tokenize).
	simArgs []string
	// responses sends the requests to /v1/responses; jsonObject asks chat
	// for response_format json_object: traffic a stopped stream of which
	// cannot be resumed.
	responses, jsonObject bool
	// models is the gateway's models section; "" = benchkit.ModelsYAML.
	models string
	// dense says which clients send prompts dense in tokens (code, JSON,
	// digits, CJK, emoji) rather than English; routes sends each client's
	// requests to chat, completions, Responses and Messages in turn, with
	// function tools on all but completions. Clients are tenant "dense"
	// or "en", so that each kind's prompt counts can be read apart.
	dense  func(client int) bool
	routes bool
}

func scenarios(o options) map[string]*scenario {
	after := func(t time.Duration) bool { return t >= o.shiftAt }
	byTenant := func(c int) string {
		if c < o.clients*3/4 {
			return "a"
		}
		return "b"
	}
	tenants := func(share string) string {
		return fmt.Sprintf("tenants:\n  - {name: a, api_keys: [key-a]%s}\n  - {name: b, api_keys: [key-b]%s}\n", share, share)
	}
	m := map[string]*scenario{
		"shift": {name: "shift", title: "every request long from the change on",
			long: func(_ int, t time.Duration, _ *rand.Rand) bool { return after(t) }},
		"ramp": {name: "ramp", title: "the long share grows from 0 to 100 % over the run", fromStart: true,
			long: func(_ int, t time.Duration, r *rand.Rand) bool {
				return r.Float64() < float64(t)/float64(o.shiftAt+o.after)
			}},
		"tenant": {name: "tenant", title: "tenant A (3/4 of the clients) turns long, tenant B stays short",
			tenants: tenants(""), tenantOf: byTenant,
			long: func(c int, t time.Duration, _ *rand.Rand) bool { return byTenant(c) == "a" && after(t) }},
		"tenant-shares": {name: "tenant-shares", title: "the same, each tenant with share 0.5",
			tenants: tenants(", share: 0.5"), tenantOf: byTenant,
			long: func(c int, t time.Duration, _ *rand.Rand) bool { return byTenant(c) == "a" && after(t) }},
		"min-tokens": {name: "min-tokens", title: "10 % of requests carry min_tokens 1500 from the start", fromStart: true,
			minTokens: func(_ int, r *rand.Rand) int {
				if r.Float64() < 0.1 {
					return 1500
				}
				return 0
			}},
		"heavy-tail": {name: "heavy-tail", title: "lognormal outputs σ 1.2, half of the requests not streamed",
			outputLen: "lognormal:50,1.2", fromStart: true, noStream: func(c int, _ *rand.Rand) bool { return c%2 == 0 }},
		"hangup": {name: "hangup", title: "64 clients hang up on their running requests at once, then send again",
			hangupAt: o.shiftAt, hangups: 64},
		"json": {name: "json", title: "the shift on chat with response_format json_object (not resumable)", jsonObject: true,
			long: func(_ int, t time.Duration, _ *rand.Rand) bool { return after(t) }},
		"responses": {name: "responses", title: "the shift on streamed /v1/responses (not resumable)", responses: true,
			long: func(_ int, t time.Duration, _ *rand.Rand) bool { return after(t) }},
		"dense-mix": denseScenario("dense-mix", "a quarter of the clients send token-dense prompts beside English, on every route, to a backend without /tokenize",
			func(c int) bool { return c%4 == 0 }, noTokenize, ""),
		"dense-alone": denseScenario("dense-alone", "every client sends token-dense prompts, on every route, to a backend without /tokenize",
			func(int) bool { return true }, noTokenize, ""),
		"dense-estimate": denseScenario("dense-estimate", "a quarter token-dense beside English, on every route, tokenizer: estimate",
			func(c int) bool { return c%4 == 0 }, nil, benchkit.ModelsYAML+"    tokenizer: estimate\n"),
		"two-tenant":        twoTenant(o, false),
		"two-tenant-direct": twoTenant(o, true),
	}
	for _, n := range []int{2, 4, 16} {
		name := fmt.Sprintf("merged-%d", n)
		m[name] = &scenario{name: name, title: fmt.Sprintf("the shift, %d tokens an event (--stream-interval), usage on every chunk", n),
			simArgs: []string{"--stream-interval", strconv.Itoa(n)},
			long:    func(_ int, t time.Duration, _ *rand.Rand) bool { return after(t) }}
		m[name+"-steady"] = &scenario{name: name + "-steady", title: fmt.Sprintf("short answers only, %d tokens an event", n), fromStart: true,
			simArgs: []string{"--stream-interval", strconv.Itoa(n)}}
	}
	m["merged-random"] = &scenario{name: "merged-random", title: "the shift, 1-16 tokens an event at random, no usage on chunks",
		simArgs: []string{"--stream-merge", "16", "--continuous-usage=false"},
		long:    func(_ int, t time.Duration, _ *rand.Rand) bool { return after(t) }}
	return m
}

var noTokenize = []string{"--no-tokenize"}

// denseScenario is traffic whose prompts the gateway must count without
// /tokenize, from a cold start: by its estimate's bound at first, by its
// calibration once answers have taught it.
func denseScenario(name, title string, dense func(int) bool, simArgs []string, models string) *scenario {
	return &scenario{name: name, title: title, fromStart: true, dense: dense, routes: true, simArgs: simArgs, models: models,
		outputLen: "lognormal:200,0.8",
		tenants:   "tenants:\n  - {name: en, api_keys: [key-en]}\n  - {name: dense, api_keys: [key-dense]}\n",
		tenantOf: func(c int) string {
			if dense(c) {
				return "dense"
			}
			return "en"
		}}
}

// twoTenant is an interactive tenant (class critical, an eighth of the
// clients, max_tokens 256) joining, at the change, a batch tenant (class
// standard, the rest, max_tokens 1024) that has warmed the gateway up
// alone, on a preempting simulator whose outputs are lognormal around 200
// tokens: a mix of tenants, not a shift, that the change detector must not
// trip on. direct sends the same traffic to the simulator alone (vLLM
// alone, its own preemption the only guard).
func twoTenant(o options, direct bool) *scenario {
	interactive := func(c int) bool { return c < o.clients/8 }
	name, title := "two-tenant", "an interactive tenant joins a batch tenant, preempting simulator"
	if direct {
		name, title = "two-tenant-direct", "the same traffic to the simulator alone"
	}
	return &scenario{name: name, title: title, outputLen: "lognormal:200,0.8", onOverflow: "preempt", direct: direct,
		tenants: "tenants:\n  - {name: interactive, api_keys: [key-interactive], class: critical}\n  - {name: batch, api_keys: [key-batch], class: standard}\n",
		tenantOf: func(c int) string {
			if interactive(c) {
				return "interactive"
			}
			return "batch"
		},
		maxTokens: func(c int) int {
			if interactive(c) {
				return 256
			}
			return 1024
		},
		joinsLate: interactive}
}

func (sc *scenario) run(ctx context.Context, o options, kit *benchkit.Kit) (*result, error) {
	outLen := sc.outputLen
	if outLen == "" {
		outLen = "lognormal:50,0.8"
	}
	onOverflow := sc.onOverflow
	if onOverflow == "" {
		onOverflow = "oom"
	}
	args := append([]string{"--on-overflow", onOverflow, "--gpu-memory-utilization", utilization,
		"--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.Seed, 10), "--model", model,
		"--output-len", outLen, "--output-len-when", longMarker + "=uniform:1000-2000"}, sc.simArgs...)
	sim, err := kit.StartSim(ctx, "shift-"+sc.name+"-sim", args...)
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	reservation := sc.reservation
	if reservation == "" {
		reservation = o.reservation
	}
	models := sc.models
	if models == "" {
		models = benchkit.ModelsYAML
	}
	url := sim.URL
	if !sc.direct {
		gw, err := kit.StartGatewayModels(ctx, "shift-"+sc.name, utilization, "  reservation: "+reservation+"\n", sc.tenants, models,
			fmt.Sprintf("  - name: sim0\n    url: %s\n    models: [%s]\n    gpu_memory: 24GiB\n", sim.URL, model))
		if err != nil {
			return nil, err
		}
		defer gw.Stop()
		url = gw.URL
	} else {
		reservation = "none (the simulator alone)"
	}
	res := &result{sc: sc, total: o.shiftAt + o.after, shiftAt: o.shiftAt, changeAt: o.shiftAt, reservation: reservation}
	if sc.fromStart {
		res.changeAt = 0
	}
	if err := drive(ctx, o, sc, url, sim.URL, res); err != nil {
		return nil, err
	}
	// An overflow count that cannot be read is a failed run, never a zero.
	m, err := benchkit.Scrape(ctx, http.DefaultClient, sim.URL+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("read the simulator's overflow count: %w", err)
	}
	res.overflow = m.Sum("kvsim_oom_events_total")
	return res, nil
}
