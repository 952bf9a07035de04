package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/backends/sim"
)

// Issue 11, "many backends, one queue", end to end: several simulated GPUs
// behind one model, on loopback, through the real gateway.

// fillerBody holds about 500 blocks at its worst case (7992 tokens): two
// fill a 24 GiB GPU's budget at the default ceiling (1045 blocks) but for
// 45 blocks, and it runs far longer than any test, until its client hangs
// up.
const fillerBody = `{"model":"llama-3-8b","prompt":"hi","max_tokens":7990}`

// waiterBody (about 51 blocks) does not fit beside two fillers.
var waiterBody = chatBody("hi", 800, false)

// filler is a request holding a GPU's budget until its connection closes.
type filler struct {
	conn net.Conn
	gpu  string
}

// fill sends n fillers one at a time, each once the one before is bound,
// and notes the GPU each was bound to. Their connections close when the
// test ends, or earlier with release.
func fill(t *testing.T, gw *Server, gwURL string, n int, header ...string) []filler {
	t.Helper()
	out := make([]filler, 0, n)
	for range n {
		before := map[string]int{}
		total := 0
		for _, g := range gw.rt.Load().gpus {
			before[g.name] = gpuStats(gw, g.name).Tickets
			total += before[g.name]
		}
		c := rawPost(t, gwURL, "/v1/completions", fillerBody, header...)
		t.Cleanup(func() { c.Close() })
		var gpu string
		eventually(t, "the filler to be bound", func() bool {
			for name, n := range before {
				if gpuStats(gw, name).Tickets > n {
					gpu = name
					return true
				}
			}
			return false
		})
		out = append(out, filler{conn: c, gpu: gpu})
	}
	return out
}

// release hangs up the fillers on gpu.
func release(fs []filler, gpu string) {
	for _, f := range fs {
		if f.gpu == gpu {
			f.conn.Close()
		}
	}
}

// rawPost sends one request on a connection of its own, which the caller
// closes to hang up.
func rawPost(t *testing.T, gwURL, path, body string, header ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var h strings.Builder
	for i := 0; i+1 < len(header); i += 2 {
		fmt.Fprintf(&h, "%s: %s\r\n", header[i], header[i+1])
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", path, h.String(), len(body), body)
	return c
}

// send posts n copies of body concurrently; their results arrive on the
// channel as they finish.
func send(gwURL, path, body string, n int, header ...string) <-chan result {
	ch := make(chan result, n)
	for range n {
		go func() { ch <- postJSON(gwURL, path, body, header...) }()
	}
	return ch
}

// backendNamed is the gateway's backend called name.
func backendNamed(gw *Server, name string) *backends.Backend {
	for _, b := range gw.rt.Load().upstreams.Backends() {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

// startMortalSim is startSim with a kill switch: kill makes the simulator
// die as a machine does — every connection reset, the port refusing new
// ones, nothing in flight answered — and stops it.
func startMortalSim(t *testing.T, mut func(*sim.Config)) (s *sim.Server, url string, kill func()) {
	t.Helper()
	s = newSim(t, mut)
	var ml *mortalListener
	ready := make(chan struct{})
	url = serveLoopback(t, func(ln net.Listener) error {
		ml = &mortalListener{Listener: ln}
		close(ready)
		return s.Serve(ml)
	}, s.Shutdown)
	<-ready
	return s, url, func() {
		ml.kill()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		s.Shutdown(ctx) // at once: stops the engine; its handlers find their connections gone
	}
}

// mortalListener keeps every connection it accepts, to reset them all.
type mortalListener struct {
	net.Listener
	mu    sync.Mutex // guards conns and dead
	conns []net.Conn
	dead  bool
}

func (l *mortalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, c)
	return c, nil
}

func (l *mortalListener) kill() {
	l.mu.Lock()
	l.dead = true
	conns := l.conns
	l.mu.Unlock()
	l.Listener.Close()
	for _, c := range conns {
		c.(*net.TCPConn).SetLinger(0) // a reset, not an orderly close
		c.Close()
	}
}

// goAway shuts a simulator down gracefully in the background: it takes no
// new connection (so its health checks fail) while the requests it serves
// run on. stop fails those and waits for the shutdown to end; the test's
// end calls it too.
func goAway(t *testing.T, s *sim.Server) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Shutdown(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// A burst larger than one GPU's budget is spread over the three GPUs of
// the model and served by all three, none over its budget; while it waits,
// /status shows the model's waiters by class and each GPU's budget.
func TestFleetSpreadsABurst(t *testing.T) {
	t.Run("status while waiting", func(t *testing.T) {
		slow := func(c *sim.Config) { c.TimeScale = 0.1 }
		var urls []string
		for range 3 {
			_, u := startSim(t, slow)
			urls = append(urls, u)
		}
		gw, gwURL := startGateway(t, fleetConfig("admission:\n  queue: {timeout: 60s}\n", urls...), Options{})
		fs := fill(t, gw, gwURL, 6)
		for _, g := range []string{"gpu0", "gpu1", "gpu2"} {
			if p := gpuStats(gw, g); p.Tickets != 2 {
				t.Fatalf("%s holds %d fillers, want 2 on each GPU: %+v", g, p.Tickets, fs)
			}
		}
		waiting := send(gwURL, "/v1/chat/completions", waiterBody, 2)
		eventually(t, "two waiters", func() bool { return queued(gw) == 2 })
		eventually(t, "every GPU's use to be reported", func() bool {
			st := getStatus(t, gwURL)
			for _, g := range st.GPUs {
				if g.Used == nil {
					return false
				}
			}
			return len(st.GPUs) == 3
		})
		st := getStatus(t, gwURL)
		for _, g := range st.GPUs {
			p := gpuStats(gw, g.GPU)
			if g.Capacity != p.Capacity || g.Held != p.Held || g.Committed != p.Committed || g.Bound != 2 ||
				g.Held <= 0 || g.Held > g.Capacity || *g.Used < 0 || *g.Used > g.Capacity {
				t.Errorf("/status of %s: %+v, scheduler %+v", g.GPU, g, p)
			}
		}
		if len(st.Models) != 1 || st.Models[0].Queued != 2 || len(st.Models[0].GPUs) != 3 {
			t.Fatalf("/status queues: %+v", st.Models)
		}
		for _, c := range st.Models[0].Classes {
			if want := map[bool]int{true: 2}[c.Name == "standard"]; c.Queued != want {
				t.Errorf("class %s: %d waiting, want %d", c.Name, c.Queued, want)
			}
		}
		for _, g := range []string{"gpu0", "gpu1", "gpu2"} {
			release(fs, g)
		}
		for range 2 {
			if r := <-waiting; r.status != 200 {
				t.Errorf("waiter: %d %.200s", r.status, r.body)
			}
		}
		eventually(t, "every reservation to return", func() bool { return heldEverywhere(gw) == 0 })
	})

	t.Run("served by all three", func(t *testing.T) {
		// Each request is ~1000 prompt + 1000 output tokens, 126 blocks: a
		// GPU's budget holds 8, the three 24; 48 are sent together.
		var sims []*sim.Server
		var urls []string
		for range 3 {
			s, u := startSim(t, func(c *sim.Config) { c.OnOverflow = sim.OverflowOOM })
			sims, urls = append(sims, s), append(urls, u)
		}
		gw, gwURL := startGateway(t, fleetConfig("admission:\n  queue: {timeout: 60s}\n", urls...), Options{})
		const burst = 48
		res := send(gwURL, "/v1/chat/completions", chatBody(words(1000), 1000, false), burst)
		by := map[string]int{}
		for range burst {
			r := <-res
			if r.status != 200 {
				t.Fatalf("status %d: %.300s", r.status, r.body)
			}
			by[r.header.Get("X-Kvgate-Backend")]++
		}
		for i, s := range sims {
			st := s.Stats()
			name := fmt.Sprintf("gpu%d", i)
			budget := gpuStats(gw, name).Capacity / (2 << 20)
			if by[name] == 0 || st.FinishedLength+st.FinishedStop == 0 {
				t.Errorf("%s served %d (its simulator finished %d)", name, by[name], st.FinishedLength+st.FinishedStop)
			}
			if st.OOMEvents != 0 || st.PeakUsedBlocks > budget {
				t.Errorf("%s: peak %d blocks of a budget of %d, %d OOM events", name, st.PeakUsedBlocks, budget, st.OOMEvents)
			}
		}
		t.Logf("served by GPU: %v", by)
		eventually(t, "every reservation to return", func() bool { return heldEverywhere(gw) == 0 })
	})
}

// A backend killed while requests wait strands none of them: they are
// served by the GPU left. When that one goes too, its model's waiters are
// told at once that no backend serves it (503) — long before their queue
// deadline, and not as a queue timeout.
func TestFleetBackendDiesWhileRequestsWait(t *testing.T) {
	slow := func(c *sim.Config) { c.TimeScale = 0.1 }
	_, urlA, killA := startMortalSim(t, slow)
	simB, urlB := startSim(t, slow)
	gw, gwURL := startGateway(t, fleetConfig("server: {request_timeout: 30m}\nadmission:\n  queue: {timeout: 20m}\n", urlA, urlB), Options{})
	fs := fill(t, gw, gwURL, 4)
	if a, b := gpuStats(gw, "gpu0").Tickets, gpuStats(gw, "gpu1").Tickets; a != 2 || b != 2 {
		t.Fatalf("fillers on gpu0 %d, gpu1 %d; want 2 and 2", a, b)
	}
	waiting := send(gwURL, "/v1/chat/completions", waiterBody, 2)
	eventually(t, "two waiters", func() bool { return queued(gw) == 2 })

	// gpu0's simulator dies: it takes no new request. Its fillers had not
	// been answered yet (nothing of a whole answer reaches the client
	// before its end): they are moved to the queue, at their old place,
	// and a waiter bound there before its circuit opened would be too.
	killA()
	eventually(t, "gpu0 out of routing, its budget empty, its requests and the waiters queued", func() bool {
		return backendNamed(gw, "gpu0").State() == backends.StateOpen && gpuStats(gw, "gpu0").Tickets == 0 && queued(gw) == 4
	})
	release(fs, "gpu0") // their clients give up
	eventually(t, "the two waiters alone in the queue", func() bool { return queued(gw) == 2 })
	release(fs, "gpu1")
	for range 2 {
		r := <-waiting
		if r.status != 200 || r.header.Get("X-Kvgate-Backend") != "gpu1" {
			t.Fatalf("a waiter when gpu0 died: %d from %q: %.200s", r.status, r.header.Get("X-Kvgate-Backend"), r.body)
		}
	}

	// gpu1 fills again, two more wait, and its simulator goes away: it
	// takes no new connection, so its health checks fail, while the
	// requests it serves run on (and keep its budget full: the waiters
	// could not be bound to it in the moment before its circuit opens).
	fs = fill(t, gw, gwURL, 2)
	if b := gpuStats(gw, "gpu1").Tickets; b != 2 || fs[0].gpu != "gpu1" || fs[1].gpu != "gpu1" {
		t.Fatalf("fillers %+v, gpu1 holds %d", fs, b)
	}
	waiting = send(gwURL, "/v1/chat/completions", waiterBody, 2)
	eventually(t, "two waiters", func() bool { return queued(gw) == 2 })
	stop := goAway(t, simB)
	for range 2 {
		r := <-waiting
		if r.status != 503 || r.retryAfter != "" {
			t.Fatalf("a waiter when the last backend went: %d (Retry-After %q): %.200s", r.status, r.retryAfter, r.body)
		}
		if e := decodeError(t, r.body); e.Error.Code == nil || *e.Error.Code != "no_healthy_backend" {
			t.Fatalf("a waiter when the last backend went: %+v", e.Error)
		}
	}
	st := gw.rt.Load().sched.Stats()
	if n := requests(gw, outcomeFailed, "no_backend"); n != 2 || st.Rejected["no_route"] != 2 || st.Rejected["queue_timeout"] != 0 {
		t.Errorf("%d answered no_backend; refused no_route %d, queue_timeout %d", n, st.Rejected["no_route"], st.Rejected["queue_timeout"])
	}
	stop()
	eventually(t, "every reservation to return", func() bool { return heldEverywhere(gw) == 0 })
}

// A request whose backend fails before answering is moved once to another
// GPU — its reservation with it, never held on both — and is answered
// there; if that one fails too, the client gets the failure, not a third
// try.
func TestFleetRetriesOnceOnAnotherGPU(t *testing.T) {
	var gwp atomic.Pointer[Server]
	type hit struct{ gpu0, gpu1 int64 } // what each GPU held as the second backend saw the request
	broken := func(hits *atomic.Int64) string {
		return startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
			if tokenize3(w, r) {
				return
			}
			hits.Add(1)
			// Dies before answering: the connection is reset.
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		}).URL
	}
	for _, tc := range []struct {
		name       string
		secondOK   bool
		wantStatus int
	}{
		{"the other GPU answers", true, 200},
		{"the other GPU fails too", false, 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var firstHits, secondHits atomic.Int64
			seen := make(chan hit, 1)
			second := broken(&secondHits)
			if tc.secondOK {
				second = startFake(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
					if tokenize3(w, r) {
						return
					}
					io.Copy(io.Discard, r.Body)
					secondHits.Add(1)
					gw := gwp.Load()
					seen <- hit{gpuStats(gw, "gpu0").Held, gpuStats(gw, "gpu1").Held}
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, `{"choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
				}).URL
			}
			// The failing backend's GPU is the larger: the request is bound
			// there first.
			gw, gwURL := startGateway(t, fleetConfig("", broken(&firstHits)+" 80GiB", second), Options{DisableProbes: true})
			gwp.Store(gw)
			r := postJSON(gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":5}`)
			if r.status != tc.wantStatus || firstHits.Load() != 1 || secondHits.Load() != 1 {
				t.Fatalf("status %d (want %d), tries on gpu0 %d and gpu1 %d (want 1 each): %.300s",
					r.status, tc.wantStatus, firstHits.Load(), secondHits.Load(), r.body)
			}
			if tc.secondOK {
				if b := r.header.Get("X-Kvgate-Backend"); b != "gpu1" {
					t.Errorf("answered by %q", b)
				}
				if h := <-seen; h.gpu0 != 0 || h.gpu1 <= 0 {
					t.Errorf("while gpu1 served the moved request: gpu0 held %d, gpu1 %d", h.gpu0, h.gpu1)
				}
			} else if e := decodeError(t, r.body); e.Error.Code == nil || *e.Error.Code != "upstream_error" || !strings.Contains(e.Error.Message, "gpu1") {
				t.Errorf("both failed: %+v", e.Error)
			}
			eventually(t, "every reservation to return", func() bool { return heldEverywhere(gw) == 0 })
		})
	}
}

// GPUs of different sizes behind one model (24 and 80 GiB) are each filled
// to their own budget: the larger takes as many more requests as its
// budget holds, and the next request waits only when neither has room.
func TestFleetHeterogeneousGPUs(t *testing.T) {
	slow := func(c *sim.Config) { c.TimeScale = 1 }
	_, small := startSim(t, slow)
	_, large := startSim(t, func(c *sim.Config) { slow(c); c.GPUMemory = 80 << 30 })
	gw, gwURL := startGateway(t, fleetConfig("admission:\n  queue: {timeout: 60s}\n", small, large+" 80GiB"), Options{})
	g0, g1 := gpuStats(gw, "gpu0"), gpuStats(gw, "gpu1")
	if g1.Capacity < 10*g0.Capacity {
		t.Fatalf("budgets %d and %d: the 80 GiB GPU should hold many times the 24 GiB one", g0.Capacity, g1.Capacity)
	}
	// 2 fillers fit the small budget, 45 the large: send one more.
	perFiller := blocksOf(7992)
	want0, want1 := int(g0.Capacity/perFiller), int(g1.Capacity/perFiller)
	var conns []net.Conn
	for range want0 + want1 + 1 {
		c := rawPost(t, gwURL, "/v1/completions", fillerBody)
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	eventually(t, "both GPUs full and one request waiting", func() bool {
		return gpuStats(gw, "gpu0").Tickets+gpuStats(gw, "gpu1").Tickets == want0+want1 && queued(gw) == 1
	})
	for _, tc := range []struct {
		gpu  string
		want int
	}{{"gpu0", want0}, {"gpu1", want1}} {
		p := gpuStats(gw, tc.gpu)
		if p.Tickets != tc.want || p.Held != int64(tc.want)*perFiller || p.Capacity-p.Held >= perFiller {
			t.Errorf("%s: %d requests hold %d of %d; want %d filling it", tc.gpu, p.Tickets, p.Held, p.Capacity, tc.want)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	eventually(t, "every reservation to return", func() bool { return heldEverywhere(gw) == 0 && queued(gw) == 0 })
}

// routing: affinity sends the requests of one session to the same GPU, as
// long as it has room for them; sessions spread over the GPUs.
func TestFleetAffinityKeepsASessionOnItsGPU(t *testing.T) {
	slow := func(c *sim.Config) { c.TimeScale = 0.1 }
	var urls []string
	for range 3 {
		_, u := startSim(t, slow)
		urls = append(urls, u)
	}
	gw, gwURL := startGateway(t, fleetConfig("routing: affinity\nadmission:\n  queue: {timeout: 60s}\n", urls...), Options{})
	small := chatBody("hi", 5, false)
	home := map[string]string{}
	used := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for s := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			session := fmt.Sprintf("session-%d", s)
			for i := range 3 {
				r := postJSON(gwURL, "/v1/chat/completions", small, "X-Session-Id", session)
				b := r.header.Get("X-Kvgate-Backend")
				mu.Lock()
				switch {
				case r.status != 200:
					t.Errorf("%s request %d: %d %.200s", session, i, r.status, r.body)
				case i == 0:
					home[session], used[b] = b, true
				case b != home[session]:
					t.Errorf("%s request %d went to %s, its first to %s", session, i, b, home[session])
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(used) < 2 {
		t.Errorf("16 sessions all on %v", used)
	}

	// Its GPU full, a session's request that does not fit goes elsewhere;
	// one that fits still goes home.
	session := "session-0"
	fs := fill(t, gw, gwURL, 2, "X-Session-Id", session)
	if fs[0].gpu != home[session] || fs[1].gpu != home[session] {
		t.Fatalf("the session's fillers went to %s and %s, its home is %s", fs[0].gpu, fs[1].gpu, home[session])
	}
	if r := postJSON(gwURL, "/v1/chat/completions", waiterBody, "X-Session-Id", session); r.status != 200 || r.header.Get("X-Kvgate-Backend") == home[session] {
		t.Errorf("a request too large for the session's full GPU: %d from %q", r.status, r.header.Get("X-Kvgate-Backend"))
	}
	if r := postJSON(gwURL, "/v1/chat/completions", small, "X-Session-Id", session); r.status != 200 || r.header.Get("X-Kvgate-Backend") != home[session] {
		t.Errorf("a small request of the session: %d from %q, its home is %s", r.status, r.header.Get("X-Kvgate-Backend"), home[session])
	}
}

// A reload that removes a backend: its model's waiters go to the GPUs
// left, even when the removed one frees room first; the requests it was
// serving finish there and give their reservations back.
func TestFleetReloadRemovesABackend(t *testing.T) {
	slow := func(c *sim.Config) { c.TimeScale = 0.1 }
	_, urlA := startSim(t, slow)
	_, urlB := startSim(t, slow)
	extra := "admission:\n  queue: {timeout: 60s}\n"
	gw, gwURL := startGateway(t, fleetConfig(extra, urlA, urlB), Options{})
	fs := fill(t, gw, gwURL, 4)
	waiting := send(gwURL, "/v1/chat/completions", waiterBody, 2)
	eventually(t, "two waiters", func() bool { return queued(gw) == 2 })

	// gpu1 is now the only backend; gpu0's requests run on.
	cfg, err := Parse([]byte(strings.Replace(fleetConfig(extra, urlB), "name: gpu0", "name: gpu1", 1)), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	removed := func() int64 { return heldEverywhere(gw) - gpuStats(gw, "gpu1").Held }
	if h := removed(); h != 2*blocksOf(7992) || queued(gw) != 2 {
		t.Fatalf("after the reload: gpu0 holds %d, %d queued", h, queued(gw))
	}
	// gpu0's requests end: the waiters do not go there.
	release(fs, "gpu0")
	eventually(t, "gpu0's requests to give their budget back", func() bool { return removed() == 0 })
	if queued(gw) != 2 {
		t.Fatalf("%d queued once the removed GPU emptied; want both waiters still waiting", queued(gw))
	}
	release(fs, "gpu1")
	for range 2 {
		if r := <-waiting; r.status != 200 || r.header.Get("X-Kvgate-Backend") != "gpu1" {
			t.Fatalf("a waiter: %d from %q: %.200s", r.status, r.header.Get("X-Kvgate-Backend"), r.body)
		}
	}
	eventually(t, "every reservation to return", func() bool { return heldEverywhere(gw) == 0 })
}

// Issue 11 benchmark finding: a backend killed under load had its circuit
// half-open after the cooldown, and the dispatcher bound every waiter that
// fit its empty GPU to it at once; each failed to connect and spent its one
// move. A circuit that connection failures opened now stays out of routing
// until a health check passes.
func TestDeadBackendStaysOutOfRoutingPastItsCooldown(t *testing.T) {
	clock := admissiontest.NewClock(time.Unix(1e9, 0))
	_, live := startSim(t, nil)
	// Probes off: the test moves the circuit and the routes itself.
	gw, gwURL := startGateway(t, fleetConfig("", deadURL(t)+" 80GiB", live), Options{DisableProbes: true, Clock: clock})
	routes := func() map[string]bool {
		up := map[string]bool{}
		for _, r := range gw.rt.Load().sched.Stats().Queues[0].GPUs {
			up[r.GPU] = r.Up
		}
		return up
	}
	dead := backendNamed(gw, "gpu0")
	for range 2 {
		dead.ReportFailure(errors.New("dial tcp: connection refused"))
	}
	gw.rt.Load().syncRoutes()
	if up := routes(); up["gpu0"] || !up["gpu1"] {
		t.Fatalf("with gpu0's circuit open: routes %v", up)
	}
	clock.Advance(time.Minute) // far past the cooldown
	gw.rt.Load().syncRoutes()
	if up := routes(); up["gpu0"] || dead.State() != backends.StateOpen {
		t.Fatalf("past the cooldown, gpu0 (never probed since it failed) is %s and routed: %v", dead.State(), up)
	}
	// The larger, empty GPU is dead: a request goes straight to the other.
	r := postJSON(gwURL, "/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":5}`)
	if r.status != 200 || r.header.Get("X-Kvgate-Backend") != "gpu1" || counter(gw.m.upstreamErrors, "gpu0", "transport") != 0 {
		t.Fatalf("%d from %q, %g transport errors on gpu0: %.200s", r.status, r.header.Get("X-Kvgate-Backend"),
			counter(gw.m.upstreamErrors, "gpu0", "transport"), r.body)
	}
	// A passing health check brings it back.
	dead.ReportSuccess()
	gw.rt.Load().syncRoutes()
	if up := routes(); !up["gpu0"] {
		t.Fatalf("after a passing probe: routes %v", up)
	}
}
