// Command shift measures whether the gateway keeps its promise — the GPU
// never overflows — when traffic departs from the history its forecast was
// learned on. Each scenario runs the gateway (reservation predicted unless
// --reservation says otherwise, every other key at its default) in front of
// an oom simulator whose pool is the budget, with
// closed-loop clients sending ~340-token prompts and max_tokens 2048:
//
//   - shift: outputs short (lognormal median 50) then, at the shift, every
//     request long (1000–2000 tokens);
//   - ramp: the long share grows from 0 to all of the traffic over the run;
//   - tenant / tenant-shares: tenant A (96 clients) turns long at the shift,
//     tenant B (32 clients) stays short; without and with `share: 0.5` each;
//   - min-tokens: 10 % of requests carry min_tokens 1500 from the start;
//   - heavy-tail: lognormal outputs with σ 1.2, half of them not streamed;
//   - hangup: 64 clients hang up on their running requests at once.
//
// Long answers are made by the simulator's --output-len-when: a request
// whose prompt carries a marker is drawn from the long distribution, so no
// field a gateway could read tells it apart — as a real model answers an
// essay question at length. The same long traffic through worst_case
// reservations is the goodput baseline after the shift.
//
//	go run ./bench/shift [--clients 128] [--time-scale 0.5] [--scenarios shift,ramp,...]
//
// It prints, per scenario, the simulator's out-of-memory events, requests
// the gateway stopped itself (share of those admitted after the shift),
// tenant B's losses, goodput windows, KV use and the learned p90, then the
// issue's acceptance checks.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

const (
	model      = benchkit.Model
	longMarker = "LONGANSWER"
	maxTokens  = 2048
	// The simulator's pool at 0.9 of 24 GiB, and the gateway's ceiling at
	// the same 0.9: the budget is the whole pool.
	utilization = "0.9"
)

type options struct {
	clients     int
	timeScale   float64
	scenarios   string
	out         string
	kvgate      string
	seed        uint64
	shiftAt     time.Duration
	after       time.Duration
	reservation string
}

func main() {
	var o options
	flag.IntVar(&o.clients, "clients", 128, "concurrent clients")
	flag.Float64Var(&o.timeScale, "time-scale", 0.5, "simulator wall time per simulated time")
	flag.StringVar(&o.scenarios, "scenarios", "shift,ramp,tenant,tenant-shares,min-tokens,heavy-tail,hangup", "scenarios to run")
	flag.StringVar(&o.out, "out", "", "directory for configs and logs (default: a temporary one)")
	flag.StringVar(&o.kvgate, "kvgate", "", "kvgate binary (default: go build ./cmd/kvgate)")
	flag.Uint64Var(&o.seed, "seed", 7, "seed of the simulator and the clients")
	flag.DurationVar(&o.shiftAt, "shift-at", 30*time.Second, "when the traffic changes")
	flag.DurationVar(&o.after, "after", 60*time.Second, "how long the run goes on after the change")
	flag.StringVar(&o.reservation, "reservation", "predicted", "admission.reservation of the gateway under test (predicted, worst_case)")
	flag.Parse()
	benchkit.Main("shift", func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	kit, err := benchkit.New(ctx, "kvgate-shift-", o.out, o.kvgate)
	if err != nil {
		return err
	}
	fmt.Printf("kvgate shift benchmark: %s, %d CPUs, %s; %d clients, simulator time scale %g, change at %s, then %s\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"), o.clients, o.timeScale, o.shiftAt, o.after)
	fmt.Printf("configs and logs: %s\n\n", kit.Dir)
	all := scenarios(o)
	var results []*result
	for _, name := range strings.Split(o.scenarios, ",") {
		sc, ok := all[name]
		if !ok {
			return fmt.Errorf("unknown scenario %q", name)
		}
		r, err := sc.run(ctx, o, kit)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		results = append(results, r)
		r.print(os.Stdout)
	}
	// The goodput baseline: the long traffic alone through worst_case.
	var base *result
	for _, r := range results {
		if r.sc.name == "shift" {
			b, err := (&scenario{name: "baseline", title: "long traffic only, reservation worst_case", reservation: "worst_case",
				long: func(int, time.Duration, *rand.Rand) bool { return true }}).run(ctx, o, kit)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			b.print(os.Stdout)
			base = b
		}
	}
	fmt.Println()
	checks(os.Stdout, o, results, base)
	return nil
}

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
	// fromStart: the traffic departs from its history from the start (a
	// ramp, a field, a heavy tail), so requests count from there.
	fromStart bool
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
	return map[string]*scenario{
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
	}
}

// outcome is how one request ended.
type outcome int

const (
	ok       outcome = iota
	stopped          // the gateway stopped it (kv_guard_stopped)
	oom              // the backend failed it: out of memory
	shed             // 429
	canceled         // our own hang-up
	other
)

var outcomeNames = [...]string{"ok", "stopped", "oom", "shed", "canceled", "other"}

type record struct {
	start, end time.Duration
	tenant     string
	long       bool
	outcome    outcome
	tokens     int
	detail     string
}

type sample struct {
	at         time.Duration
	kv         float64
	p90        int
	distrusted bool
	overcommit float64 // worst cases held / capacity
	trips      map[string]int64
}

type result struct {
	sc       *scenario
	records  []record
	samples  []sample
	overflow float64
	total    time.Duration
	shiftAt  time.Duration
	// changeAt is when the traffic starts to depart from its history:
	// requests sent from then on are the ones the stop bar counts.
	changeAt    time.Duration
	reservation string
}

func (sc *scenario) run(ctx context.Context, o options, kit *benchkit.Kit) (*result, error) {
	outLen := sc.outputLen
	if outLen == "" {
		outLen = "lognormal:50,0.8"
	}
	sim, err := kit.StartSim(ctx, "shift-"+sc.name+"-sim", "--on-overflow", "oom", "--gpu-memory-utilization", utilization,
		"--time-scale", strconv.FormatFloat(o.timeScale, 'g', -1, 64), "--seed", strconv.FormatUint(o.seed, 10), "--model", model,
		"--output-len", outLen, "--output-len-when", longMarker+"=uniform:1000-2000")
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	reservation := sc.reservation
	if reservation == "" {
		reservation = o.reservation
	}
	gw, err := kit.StartGateway(ctx, "shift-"+sc.name, sim.URL, utilization, "  reservation: "+reservation+"\n", sc.tenants)
	if err != nil {
		return nil, err
	}
	defer gw.Stop()
	res := &result{sc: sc, total: o.shiftAt + o.after, shiftAt: o.shiftAt, changeAt: o.shiftAt, reservation: reservation}
	if sc.fromStart {
		res.changeAt = 0
	}
	err = drive(ctx, o, sc, gw.URL, sim.URL, res)
	if m, err := benchkit.Scrape(ctx, http.DefaultClient, sim.URL+"/metrics"); err == nil {
		res.overflow = m.Sum("kvsim_oom_events_total")
	}
	return res, err
}

// drive runs the clients and the monitor for the scenario's time.
func drive(ctx context.Context, o options, sc *scenario, url, simURL string, res *result) error {
	ctx, cancel := context.WithTimeout(ctx, res.total)
	defer cancel()
	start := time.Now()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.clients * 2, MaxConnsPerHost: o.clients * 2}}
	var mu sync.Mutex
	hangup := make(chan struct{})
	var wg sync.WaitGroup
	for c := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(o.seed, uint64(c)))
			for seq := 0; ctx.Err() == nil; seq++ {
				rec := send(ctx, client, url, sc, c, seq, time.Since(start), rnd, hangup)
				rec.end = time.Since(start)
				if ctx.Err() != nil && rec.outcome != ok {
					return // cut by the end of the run: not counted
				}
				mu.Lock()
				res.records = append(res.records, rec)
				mu.Unlock()
			}
		}()
	}
	if sc.hangupAt > 0 {
		go func() {
			select {
			case <-time.After(sc.hangupAt):
				close(hangup)
			case <-ctx.Done():
			}
		}()
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		s := sample{at: time.Since(start)}
		if m, err := benchkit.Scrape(ctx, http.DefaultClient, simURL+"/metrics"); err == nil {
			s.kv = m.Sum("vllm:kv_cache_usage_perc")
		}
		if st, err := status(ctx, url); err == nil && len(st.Queues) > 0 && len(st.GPUs) > 0 {
			s.p90, s.distrusted = st.Queues[0].P90, st.Queues[0].Distrusted
			s.overcommit = float64(st.GPUs[0].Held) / math.Max(1, float64(st.GPUs[0].Capacity))
			s.trips = st.Admission.Trips
		}
		res.samples = append(res.samples, s)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(res.records, func(a, b record) int { return int(a.start - b.start) })
	return nil
}

type statusView struct {
	Admission struct {
		GuardStops int64            `json:"guard_stops"`
		Trips      map[string]int64 `json:"forecast_trips"`
	} `json:"admission"`
	GPUs []struct {
		Held      int64 `json:"held_bytes"`
		Capacity  int64 `json:"capacity_bytes"`
		Committed int64 `json:"committed_bytes"`
	} `json:"gpus"`
	Queues []struct {
		P90        int  `json:"p90_output_tokens"`
		Distrusted bool `json:"distrusted"`
	} `json:"queues"`
}

func status(ctx context.Context, url string) (statusView, error) {
	var v statusView
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// prompt is about 340 tokens of the simulator's tokenizer (four bytes a
// token), unique per request so that each draws its own length.
func prompt(c, seq int, long bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "client %d request %d. ", c, seq)
	if long {
		b.WriteString(longMarker + " ")
	}
	for b.Len() < 1360 {
		b.WriteString("the quick brown fox jumps over the lazy dog ")
	}
	return b.String()
}

func send(ctx context.Context, client *http.Client, url string, sc *scenario, c, seq int, at time.Duration, rnd *rand.Rand, hangup <-chan struct{}) record {
	rec := record{start: at}
	if sc.tenantOf != nil {
		rec.tenant = sc.tenantOf(c)
	}
	rec.long = sc.long != nil && sc.long(c, at, rnd)
	stream := sc.noStream == nil || !sc.noStream(c, rnd)
	body := map[string]any{"model": model, "max_tokens": maxTokens, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": prompt(c, seq, rec.long)}}}
	if sc.minTokens != nil {
		if m := sc.minTokens(c, rnd); m > 0 {
			body["min_tokens"], rec.long = m, true
		}
	}
	if stream {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sc.hangupAt > 0 && c < sc.hangups {
		select {
		case <-hangup: // hung up once already
		default:
			go func() {
				select {
				case <-hangup:
					cancel()
				case <-rctx.Done():
				}
			}()
		}
	}
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if rec.tenant != "" {
		req.Header.Set("Authorization", "Bearer key-"+rec.tenant)
	}
	resp, err := client.Do(req)
	if err != nil {
		return classifyErr(rec, rctx, ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		rec.outcome, rec.detail = classifyError(resp.StatusCode, data)
		return rec
	}
	if !stream {
		var v struct {
			Usage struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return classifyErr(rec, rctx, ctx, err)
		}
		if err := json.Unmarshal(data, &v); err != nil {
			rec.outcome, rec.detail = other, "bad JSON"
			return rec
		}
		rec.outcome, rec.tokens = ok, v.Usage.Completion
		return rec
	}
	sc2 := bufio.NewScanner(resp.Body)
	sc2.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc2.Scan() {
		line := sc2.Bytes()
		data, found := bytes.CutPrefix(line, []byte("data: "))
		if !found {
			continue
		}
		if string(data) == "[DONE]" {
			done = true
			break
		}
		if bytes.Contains(data, []byte(`"error"`)) {
			rec.outcome, rec.detail = classifyError(200, data)
			return rec
		}
		if bytes.Contains(data, []byte(`"usage"`)) && !bytes.Contains(data, []byte(`"usage":null`)) {
			var v struct {
				Usage struct {
					Completion int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal(data, &v) == nil && v.Usage.Completion > 0 {
				rec.tokens = v.Usage.Completion
			}
		}
	}
	if !done {
		return classifyErr(rec, rctx, ctx, sc2.Err())
	}
	rec.outcome = ok
	return rec
}

func classifyErr(rec record, rctx, ctx context.Context, err error) record {
	if rctx.Err() != nil && ctx.Err() == nil {
		rec.outcome = canceled
		return rec
	}
	rec.outcome, rec.detail = other, fmt.Sprint(err)
	return rec
}

func classifyError(status int, data []byte) (outcome, string) {
	switch {
	case bytes.Contains(data, []byte("kv_guard_stopped")):
		return stopped, ""
	case bytes.Contains(data, []byte("out of memory")):
		return oom, ""
	case status == http.StatusTooManyRequests:
		return shed, ""
	}
	d := string(data)
	if len(d) > 200 {
		d = d[:200]
	}
	return other, fmt.Sprintf("%d %s", status, d)
}

// window sums what answered requests generated between from and to
// (finished in it), per second.
func (r *result) goodput(from, to time.Duration) float64 {
	var t int
	for _, x := range r.records {
		if x.outcome == ok && x.end >= from && x.end < to {
			t += x.tokens
		}
	}
	return float64(t) / (to - from).Seconds()
}

func (r *result) kvMean(from, to time.Duration) float64 {
	var s float64
	n := 0
	for _, x := range r.samples {
		if x.at >= from && x.at < to {
			s += x.kv
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return s / float64(n)
}

// count is how many records match.
func (r *result) count(f func(record) bool) int {
	n := 0
	for _, x := range r.records {
		if f(x) {
			n++
		}
	}
	return n
}

// admittedAfter counts the requests sent from t on that got a backend's
// answer or were stopped (not shed, not our hang-ups).
func (r *result) admittedAfter(t time.Duration) int {
	return r.count(func(x record) bool { return x.start >= t && x.outcome != shed && x.outcome != canceled })
}

// p90At is the learned p90 the gateway showed at t (the last sample
// before it).
func (r *result) p90At(t time.Duration) int {
	p := 0
	for _, s := range r.samples {
		if s.at <= t {
			p = s.p90
		}
	}
	return p
}

// longP90 is the p90 of the answered long requests' lengths.
func (r *result) longP90() int {
	var n []int
	for _, x := range r.records {
		if x.long && x.outcome == ok {
			n = append(n, x.tokens)
		}
	}
	if len(n) == 0 {
		return 0
	}
	slices.Sort(n)
	return n[int(math.Ceil(0.9*float64(len(n))))-1]
}

func (r *result) print(w io.Writer) {
	fmt.Fprintf(w, "Scenario %s (reservation %s): %s\n", r.sc.name, r.reservation, r.sc.title)
	by := map[outcome]int{}
	for _, x := range r.records {
		by[x.outcome]++
	}
	var parts []string
	for i, n := range outcomeNames {
		parts = append(parts, fmt.Sprintf("%s %d", n, by[outcome(i)]))
	}
	fmt.Fprintf(w, "  requests: %s\n", strings.Join(parts, ", "))
	after := r.admittedAfter(r.changeAt)
	stoppedAfter := r.count(func(x record) bool { return x.start >= r.changeAt && x.outcome == stopped })
	fmt.Fprintf(w, "  overflow events %.0f; stopped by the gateway %d of %d admitted after the change (%.2f%%)\n",
		r.overflow, stoppedAfter, after, 100*float64(stoppedAfter)/math.Max(1, float64(after)))
	if r.sc.tenantOf != nil {
		lostB := r.count(func(x record) bool { return x.tenant == "b" && (x.outcome == oom || x.outcome == stopped) })
		okB := r.count(func(x record) bool { return x.tenant == "b" && x.outcome == ok })
		fmt.Fprintf(w, "  tenant B: %d answered, %d lost (out of memory or stopped)\n", okB, lostB)
	}
	s := r.shiftAt
	fmt.Fprintf(w, "  goodput tok/s: before %.0f, first 30s after %.0f, 30–60s after %.0f; KV mean before %.1f%%, 30–60s after %.1f%%\n",
		r.goodput(s/3, s), r.goodput(s, s+30*time.Second), r.goodput(s+30*time.Second, s+60*time.Second),
		100*r.kvMean(s/3, s), 100*r.kvMean(s+30*time.Second, s+60*time.Second))
	fmt.Fprintf(w, "  learned p90: %d before, %d at +10s, %d at +30s; long answers' p90 %d\n",
		r.p90At(s-time.Second), r.p90At(s+10*time.Second), r.p90At(s+30*time.Second), r.longP90())
	var distrusted, before int
	var overcommit float64
	var trips map[string]int64
	for _, x := range r.samples {
		if x.at < s {
			before++
			overcommit += x.overcommit
			if x.distrusted {
				distrusted++
			}
		}
		if x.trips != nil {
			trips = x.trips
		}
	}
	fmt.Fprintf(w, "  before the change: distrusted %d of %d samples, worst cases held %.1f× the budget on average; forecast trips by the end %v\n",
		distrusted, before, overcommit/math.Max(1, float64(before)), trips)
	shown := 0
	for _, x := range r.records {
		if x.outcome == other && shown < 3 {
			fmt.Fprintf(w, "  other: %s\n", x.detail)
			shown++
		}
	}
}

func checks(w io.Writer, o options, results []*result, base *result) {
	fmt.Fprintf(w, "Acceptance (issue \"The promise holds whatever the traffic does\"), reservation %s, oom simulator:\n", o.reservation)
	for _, r := range results {
		after := r.admittedAfter(r.changeAt)
		stoppedAfter := r.count(func(x record) bool { return x.start >= r.changeAt && x.outcome == stopped })
		benchkit.Check(w, r.overflow == 0, "%s: zero overflow events (%.0f)", r.sc.name, r.overflow)
		benchkit.Check(w, float64(stoppedAfter) <= 0.02*float64(after), "%s: stopped by the gateway %d of %d admitted after the change (≤ 2%%)", r.sc.name, stoppedAfter, after)
		if r.sc.tenantOf != nil {
			lostB := r.count(func(x record) bool { return x.tenant == "b" && (x.outcome == oom || x.outcome == stopped) })
			benchkit.Check(w, lostB == 0, "%s: tenant B loses no request (%d)", r.sc.name, lostB)
		}
		if r.sc.name == "shift" && base != nil {
			s := r.shiftAt
			g := r.goodput(s+30*time.Second, s+60*time.Second)
			bg := base.goodput(s, s+30*time.Second)
			benchkit.Check(w, g >= 0.9*bg, "shift: goodput 30–60s after the change %.0f tok/s, %.2f× worst_case's on the long traffic (%.0f; ≥ 0.9×)", g, g/math.Max(bg, 1), bg)
			p, want := r.p90At(s+30*time.Second), r.longP90()
			benchkit.Check(w, p > 0 && want > 0 && float64(p) <= 2*float64(want) && 2*float64(p) >= float64(want),
				"shift: learned p90 %d within 2× of the long answers' %d 30s after the change", p, want)
		}
	}
}
