package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// workload is what one cell sends: a chat completion of a fixed prompt,
// streamed or not.
type workload struct {
	model     string
	prompt    string
	maxTokens int
	stream    bool
	// unique makes every prompt different (a counter in front of it), so
	// that no cache of prompts can answer.
	unique bool
}

// body is the request body; n numbers it when the workload is unique.
func (w workload) body(dst []byte, n uint64) []byte {
	dst = append(dst, `{"model":`...)
	dst = strconv.AppendQuote(dst, w.model)
	dst = append(dst, `,"messages":[{"role":"user","content":"`...)
	if w.unique {
		dst = strconv.AppendUint(dst, n, 10)
		dst = append(dst, ' ')
	}
	dst = append(dst, w.prompt...) // plain words: nothing to escape
	dst = append(dst, `"}],"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(w.maxTokens), 10)
	dst = append(dst, `,"stream":`...)
	dst = strconv.AppendBool(dst, w.stream)
	return append(dst, '}')
}

// sample is one cell's measurement on one target, possibly pooled over
// rounds.
type sample struct {
	lat     []time.Duration
	window  time.Duration // measured time (warm-up excluded), summed over rounds
	errors  int
	lastErr error
	// With the target's pid: the CPU time its processes spent in the
	// window, and the requests that ended in it.
	cpu   time.Duration
	ended int
}

func (s *sample) add(o sample) {
	s.lat = append(s.lat, o.lat...)
	s.window += o.window
	s.errors += o.errors
	if o.lastErr != nil {
		s.lastErr = o.lastErr
	}
	s.cpu += o.cpu
	s.ended += o.ended
}

// cpuPerRequest is the target's CPU time per request; 0 when not measured.
func (s *sample) cpuPerRequest() time.Duration {
	if s.ended == 0 {
		return 0
	}
	return s.cpu / time.Duration(s.ended)
}

// rps is requests per second over the measured window.
func (s *sample) rps() float64 {
	if s.window <= 0 {
		return 0
	}
	return float64(len(s.lat)) / s.window.Seconds()
}

// target is one URL under load, with its own kept-alive connections.
type target struct {
	name string
	url  string
	hc   *fasthttp.HostClient
	seq  *atomic.Uint64 // numbers unique prompts across targets
	pid  int            // the server's process, for its CPU time; 0 = not measured
}

func newTarget(name, url string, maxConns int, seq *atomic.Uint64) (*target, error) {
	host, ok := strings.CutPrefix(url, "http://")
	if !ok || host == "" || strings.Contains(host, "/") {
		return nil, fmt.Errorf("%s: url %q: want http://host:port", name, url)
	}
	return &target{name: name, url: url, seq: seq, hc: &fasthttp.HostClient{
		Addr:                host,
		MaxConns:            maxConns,
		MaxIdleConnDuration: time.Minute,
		ReadTimeout:         time.Minute,
		WriteTimeout:        time.Minute,
		MaxConnWaitTimeout:  time.Minute,
	}}, nil
}

// drive runs w on t from conns connections for warm + dur, and measures
// the requests that started after the warm-up and ended within dur (and,
// with t.pid, the CPU time of t's processes over dur, per request that
// ended within it).
func (t *target) drive(w workload, conns int, warm, dur time.Duration) sample {
	start := time.Now()
	from, until := start.Add(warm), start.Add(warm+dur)
	var (
		mu  sync.Mutex
		out sample
		wg  sync.WaitGroup
	)
	var cpu struct {
		d   time.Duration
		err error
	}
	if t.pid > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(from))
			c0, err := treeCPU("/proc", t.pid)
			time.Sleep(time.Until(until))
			c1, err1 := treeCPU("/proc", t.pid)
			cpu.d, cpu.err = c1-c0, errors.Join(err, err1)
		}()
	}
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				lat   []time.Duration
				ended int
				errs  int
				last  error
				buf   []byte
			)
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for {
				t0 := time.Now()
				if !t0.Before(until) {
					break
				}
				buf = w.body(buf[:0], t.seq.Add(1))
				err := t.do(req, resp, buf, w.stream)
				t1 := time.Now()
				if err != nil {
					errs++
					last = err
					if errs >= 10 {
						break // the run has failed; do not spin on a dead target
					}
					continue
				}
				if !t0.Before(from) && !t1.After(until) {
					lat = append(lat, t1.Sub(t0))
				}
				if !t1.Before(from) && !t1.After(until) {
					ended++
				}
			}
			mu.Lock()
			out.lat = append(out.lat, lat...)
			out.ended += ended
			out.errors += errs
			if last != nil {
				out.lastErr = last
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	out.window = dur
	if t.pid > 0 {
		out.cpu = cpu.d
		if cpu.err != nil {
			out.errors++
			out.lastErr = fmt.Errorf("%s: CPU time of process %d: %w", t.name, t.pid, cpu.err)
		}
	} else {
		out.ended = 0
	}
	return out
}

var doneEvent = []byte("data: [DONE]\n\n")

// do sends one request and reads the whole answer, checking that it is a
// complete one: a 200 with usage, or a stream that ends with [DONE].
func (t *target) do(req *fasthttp.Request, resp *fasthttp.Response, body []byte, stream bool) error {
	req.Reset()
	resp.Reset()
	req.SetRequestURI(t.url + "/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	resp.StreamBody = stream
	if err := t.hc.Do(req, resp); err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		b := resp.Body()
		return fmt.Errorf("%s: status %d: %s", t.name, resp.StatusCode(), b[:min(len(b), 200)])
	}
	if !stream {
		if !bytes.Contains(resp.Body(), []byte(`"completion_tokens"`)) {
			return fmt.Errorf("%s: answer without usage: %.200s", t.name, resp.Body())
		}
		return nil
	}
	defer resp.CloseBodyStream()
	tail, err := readTail(resp.BodyStream(), len(doneEvent))
	if err != nil {
		return fmt.Errorf("%s: reading the stream: %w", t.name, err)
	}
	if !bytes.Equal(tail, doneEvent) {
		return fmt.Errorf("%s: stream did not end with [DONE] (ends %q)", t.name, tail)
	}
	return nil
}

// readTail reads r to its end and returns its last n bytes.
func readTail(r io.Reader, n int) ([]byte, error) {
	if r == nil {
		return nil, errors.New("no body stream")
	}
	var chunk [4096]byte
	tail := make([]byte, 0, n+len(chunk))
	for {
		k, err := r.Read(chunk[:])
		tail = append(tail, chunk[:k]...)
		if len(tail) > n {
			tail = append(tail[:0], tail[len(tail)-n:]...)
		}
		if errors.Is(err, io.EOF) {
			return tail, nil
		}
		if err != nil {
			return tail, err
		}
	}
}
