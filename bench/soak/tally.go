package main

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// tally is what the clients saw, by route, by replica and by reason.
type tally struct {
	mu        sync.Mutex
	sent      int64
	canceled  int64 // our own hang-ups
	netErrs   int64 // transport errors not caused by our own hang-ups
	byRoute   map[string]*counts
	byReplica map[string]*counts
	reasons   map[string]int64  // "429 queue_timeout", "200 stream error guard_stop", ...
	messages  map[string]string // a reason's first message, and the route and replica it came from
	// timedOut is what each request refused for its queue deadline
	// needed, as its message says ("It needs 808.0 MiB of KV cache").
	timedOut  []float64
	halfClose counts
	// the first few answers that broke a rule, for the report
	examples []string
}

// counts are the outcomes of a set of requests.
type counts struct {
	sent, answered, refused, failedEnd, broken, unshaped, canceled, netErrs int64
}

func (t *tally) init() {
	t.byRoute, t.byReplica, t.reasons, t.messages = map[string]*counts{}, map[string]*counts{}, map[string]int64{}, map[string]string{}
}

func (t *tally) at(m map[string]*counts, k string) *counts {
	c := m[k]
	if c == nil {
		c = &counts{}
		m[k] = c
	}
	return c
}

// add counts one request: route and replica name it; halfClosed, whether
// its client half-closed; v is its answer, unless it was canceled or met
// a transport error (err).
func (t *tally) add(route, replica string, halfClosed bool, v verdict, canceled bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent++
	cs := []*counts{t.at(t.byRoute, route), t.at(t.byReplica, replica)}
	if halfClosed {
		cs = append(cs, &t.halfClose)
	}
	for _, c := range cs {
		c.sent++
		switch {
		case canceled:
			c.canceled++
		case err != nil:
			c.netErrs++
		default:
			switch v.outcome {
			case answered:
				c.answered++
			case refused:
				c.refused++
			case failedEnd:
				c.failedEnd++
			case broken:
				c.broken++
			case unshaped:
				c.unshaped++
			}
		}
	}
	switch {
	case canceled:
		t.canceled++
	case err != nil:
		t.netErrs++
		t.example(replica + " " + route + ": " + err.Error())
	case v.outcome == refused || v.outcome == failedEnd:
		k := v.reason
		if halfClosed {
			k += " (half-closed)"
		}
		t.reasons[k]++
		if strings.HasSuffix(v.reason, " queue_timeout") {
			if b, ok := needs(v.message); ok {
				t.timedOut = append(t.timedOut, b)
			}
		}
		if _, ok := t.messages[k]; !ok {
			t.messages[k] = replica + " " + route + ": " + v.message
		}
	case v.outcome == broken || v.outcome == unshaped:
		t.example(replica + " " + route + ": " + v.reason)
	}
}

func (t *tally) example(s string) {
	if len(t.examples) < 10 {
		t.examples = append(t.examples, s)
	}
}

// total is the outcomes over every route.
func (t *tally) total() counts {
	var c counts
	for _, r := range t.byRoute {
		c.sent += r.sent
		c.answered += r.answered
		c.refused += r.refused
		c.failedEnd += r.failedEnd
		c.broken += r.broken
		c.unshaped += r.unshaped
		c.canceled += r.canceled
		c.netErrs += r.netErrs
	}
	return c
}

// sortedKeys is m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var needsRE = regexp.MustCompile(`needs ([0-9.]+) (KiB|MiB|GiB) of KV cache`)

// needs reads how many bytes a refusal's message says the request needed.
func needs(msg string) (float64, bool) {
	m := needsRE.FindStringSubmatch(msg)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	return v * map[string]float64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]], true
}
