package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

// schedule is what happens at which request of the run: the faults the
// package comment lists, each at a fixed share of --requests, the reloads
// and the samples of each replica's memory. A fault runs in the client that
// reaches its request, one fault at a time, while the other clients go on.
func (s *soak) schedule(ctx context.Context, warm int) map[int]func() error {
	n := s.o.requests
	at := func(share float64) int { return max(warm+1, int(share*float64(n))) }
	steps := map[int][]func() error{}
	add := func(i int, f func() error) { steps[i] = append(steps[i], f) }

	add(at(0.13), func() error { return s.removeAndReAdd(ctx, at(0.13), 2) })
	add(at(0.18), func() error { return s.setBackend(at(0.18), 3, true) })
	add(at(0.25), func() error {
		m := s.sims[1]
		m.oomBefore += s.simMetric(m, "kvsim_oom_events_total")
		m.peakBefore = max(m.peakBefore, s.simMetric(m, "kvsim_kv_usage_peak_ratio"))
		m.proc.Kill()
		s.note("request %d: SIGKILL sim1", at(0.25))
		return nil
	})
	add(at(0.32), func() error { return s.setBackend(at(0.32), 3, false) })
	add(at(0.40), func() error {
		s.note("request %d: sim1 restarted on its port", at(0.40))
		return s.startSim(ctx, 1)
	})
	add(at(0.47), func() error { return s.pause(at(0.47), s.replicas[1]) })
	add(at(0.55), func() error {
		s.note("request %d: SIGHUP with a broken config to every replica", at(0.55))
		return s.reload(true)
	})
	add(at(0.63), func() error { return s.blackhole(at(0.63), s.replicas[2]) })
	for i := warm + 1; i < n; i++ {
		if i%s.o.reloadEvery == 0 {
			add(i, func() error { return s.reload(false) })
		}
		if i%(n/10) == 0 {
			add(i, func() error { s.sample(i); return nil })
		}
	}
	sched := map[int]func() error{}
	for i, fs := range steps {
		sched[i] = func() error {
			for _, f := range fs {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return sched
}

func (s *soak) note(format string, a ...any) {
	line := fmt.Sprintf(format, a...)
	fmt.Println("soak: " + line)
	s.faults = append(s.faults, line)
}

// removeAndReAdd removes simulator i by a reload of every replica and
// re-adds it by the next, at once, while requests run on it: long streams
// started just before, besides the load's own.
func (s *soak) removeAndReAdd(ctx context.Context, at, i int) error {
	m := s.sims[i]
	wait := s.longStreams(ctx, 24)
	defer wait()
	before := s.simMetric(m, "vllm:num_requests_running")
	start := time.Now()
	s.inConfig[i] = false
	if err := s.reload(false); err != nil {
		return err
	}
	removed := time.Since(start)
	between := s.simMetric(m, "vllm:num_requests_running")
	s.inConfig[i] = true
	if err := s.reload(false); err != nil {
		return err
	}
	after := s.simMetric(m, "vllm:num_requests_running")
	s.note("request %d: %s removed by a reload (%g requests running on it; every replica reloaded in %s) and re-added by the next (%g running in between, %g after)",
		at, m.name, before, removed.Round(time.Millisecond), between, after)
	return nil
}

// longStreams starts n streamed chats of 4096 tokens spread over the
// replicas and returns once each has its first event (or 10 s have
// passed); wait waits for their ends. They are tallied as the load's
// requests are.
func (s *soak) longStreams(ctx context.Context, n int) (wait func()) {
	var started, done sync.WaitGroup
	body := []byte(`{"model":"llama-3-8b","messages":[{"role":"user","content":"tell a long story"}],"max_tokens":4096,"stream":true}`)
	for k := range n {
		r := s.replicas[k%len(s.replicas)]
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			var once sync.Once
			first := func() { once.Do(started.Done) }
			defer first()
			req, _ := http.NewRequestWithContext(ctx, "POST", r.url+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer key-alpha")
			resp, err := s.client.Do(req)
			if err != nil {
				s.tally.add(apiChat.String(), r.name, false, verdict{}, false, err)
				return
			}
			defer resp.Body.Close()
			var got bytes.Buffer
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadBytes('\n')
				got.Write(line)
				if bytes.HasPrefix(line, []byte("data:")) {
					first()
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					s.tally.add(apiChat.String(), r.name, false, verdict{}, false, err)
					return
				}
			}
			s.tally.add(apiChat.String(), r.name, false, judge(apiChat, true, resp.StatusCode, got.Bytes()), false, nil)
		}()
	}
	ch := make(chan struct{})
	go func() { started.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
	}
	return done.Wait
}

// setBackend adds or removes simulator i by a reload of every replica.
func (s *soak) setBackend(at, i int, in bool) error {
	s.inConfig[i] = in
	if in {
		s.note("request %d: %s added by a reload", at, s.sims[i].name)
	} else {
		running := s.simMetric(s.sims[i], "vllm:num_requests_running")
		s.note("request %d: %s removed by a reload (%g requests running on it)", at, s.sims[i].name, running)
	}
	return s.reload(false)
}

// pause stops a replica (SIGSTOP) for lease_ttl and 1.5 s more and resumes
// it. The clients leave it meanwhile; what they had sent it waits.
func (s *soak) pause(at int, r *replica) error {
	d := s.o.leaseTTL + 1500*time.Millisecond
	r.down.Store(true)
	defer r.down.Store(false)
	if err := r.proc.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	time.Sleep(d)
	others, own, residual := s.leasesSeen(r)
	if err := r.proc.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	s.note("request %d: %s paused (SIGSTOP) for %s, then SIGCONT; at its end the others leased %s, and its own %s counted on (%s as a residual hold)",
		at, r.name, d, mib(float64(others)), mib(float64(own)), mib(float64(residual)))
	return nil
}

// blackhole cuts a replica's connection to Redis for lease_ttl and 1.5 s
// more, then heals it, and says when the replica fell back to its static
// share.
func (s *soak) blackhole(at int, r *replica) error {
	d := s.o.leaseTTL + 1500*time.Millisecond
	r.proxy.Blackhole(true)
	start := time.Now()
	fellBack := time.Duration(-1)
	for time.Since(start) < d {
		if st, err := s.status(r); err == nil && st.fallback() && fellBack < 0 {
			fellBack = time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.proxy.Blackhole(false)
	when := "not seen on /status"
	if fellBack >= 0 {
		when = "after " + fellBack.Round(10*time.Millisecond).String()
	}
	s.note("request %d: %s's Redis blackholed for %s, then healed; on its static share %s", at, r.name, d, when)
	return nil
}

// leasesSeen is the fleet's leases as another replica than r lists them
// on /status, summed over the GPUs: what the others hold, and what r holds
// and how much of that counts only as its residual hold (r stopped
// renewing). /status answers the list it last read and reads a new one in
// the background, so the page is read until its list is newer than the
// first call.
func (s *soak) leasesSeen(r *replica) (others, own, residual int64) {
	for _, o := range s.replicas {
		if o == r {
			continue
		}
		asked := time.Now()
		var st statusView
		for range 20 {
			v, err := s.status(o)
			if err != nil || v.SharedBudget == nil {
				return 0, 0, 0
			}
			st = v
			if v.listedSince(asked) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, g := range st.SharedBudget.GPUs {
			for _, l := range g.Fleet {
				switch {
				case l.Replica != r.name:
					others += l.Bytes
				case l.Residual:
					own += l.Bytes
					residual += l.Bytes
				default:
					own += l.Bytes
				}
			}
		}
		return others, own, residual
	}
	return 0, 0, 0
}

// sample reads each replica's memory and goroutines at request i.
func (s *soak) sample(i int) {
	for _, r := range s.replicas {
		if m, err := s.metrics(r); err == nil {
			r.series = append(r.series, sample{at: i, rss: m["process_resident_memory_bytes"], goroutines: m["go_goroutines"]})
		}
	}
}

// simMetric is one value of a simulator's /metrics; 0 if it cannot be
// read (a killed simulator).
func (s *soak) simMetric(m *sim, name string) float64 {
	got, err := benchkit.Scrape(context.Background(), s.client, "http://"+m.addr+"/metrics")
	if err != nil {
		return 0
	}
	return got.Sum(name)
}
