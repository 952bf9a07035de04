package sim

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends/kvevents"
)

var indexChain = kvevents.Chain{Root: 7, Step: func(parent uint64, ids []uint32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:4], id)
		h.Write(b[:4])
	}
	return h.Sum64()
}}

func chainNames(p []int, bs int) []uint64 {
	var out []uint64
	parent := indexChain.Root
	ids := make([]uint32, bs)
	for j := 0; (j+1)*bs <= len(p); j++ {
		for i := range bs {
			ids[i] = uint32(p[j*bs+i])
		}
		parent = indexChain.Step(parent, ids)
		out = append(out, parent)
	}
	return out
}

// simCached is how many of r's leading prompt blocks the engine's cache
// holds: what the index must say of the same prompt.
func simCached(e *engine, r *request) int {
	n := 0
	for _, h := range r.hashes {
		if _, ok := e.cache.find(h); !ok {
			break
		}
		n++
	}
	return n
}

// waitSeq waits until sub has applied the batch seq, woken by its changes.
func waitSeq(t *testing.T, sub *kvevents.Subscriber, seq int64) kvevents.Stats {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		ch := sub.Changed()
		if st := sub.Stats(); st.LastSeq == seq && st.Whole {
			return st
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("subscriber never reached batch %d: %+v", seq, sub.Stats())
		}
	}
}

// The index a subscriber builds from the simulator's published events is
// the simulator's cache: over random sessions that share prefixes and grow
// by turns, LRU evictions, preemptions, aborts, batches dropped from the
// stream (recovered by replay) and a restart of the server, in both
// encodings.
func TestKVEventsIndexEqualsTheCache(t *testing.T) {
	for _, mapEnc := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		c := poolConfig(48)
		c.MaxModelLen = 512
		cfg := KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", MapEncoding: mapEnc}
		c.KVEvents = &cfg
		start := func() (*engine, *eventPublisher) {
			e, _ := newTestEngine(t, c)
			p, err := startPublisher(*e.s.kvEvents, e.events, e.s.logger)
			if err != nil {
				t.Fatal(err)
			}
			return e, p
		}
		e, pub := start()
		// The restarted server listens where the first did.
		cfg.Endpoint, cfg.ReplayEndpoint = "tcp://"+pub.Addr(), "tcp://"+pub.ReplayAddr()
		x := kvevents.NewIndex(indexChain)
		sub := kvevents.NewSubscriber(kvevents.Config{Endpoint: cfg.Endpoint, Replay: cfg.ReplayEndpoint, Topic: "kv", Retry: 10 * time.Millisecond}, x, nil, nil)
		done := make(chan struct{})
		go func() { defer close(done); sub.Run(ctx) }()

		rnd := uint64(42)
		next := func(n uint64) int { rnd = mix(rnd); return int(rnd % n) }
		sessions := make([][]int, 12)
		for i := range sessions {
			sessions[i] = ids(500+i%4, 40+next(60)) // four shared contexts
		}
		var live, all []*request
		checks := 0
		for step := range 600 {
			if step == 300 {
				// A restart: a new process with an empty cache, sequence
				// numbers from 0 again.
				for _, r := range live {
					e.abort(r)
				}
				pub.close()
				e, pub = start()
				live, all = nil, nil
				// Publishing on while nobody listens would lose the
				// batches to the subscriber for good: wait until it is back.
				deadline := time.After(20 * time.Second)
				for {
					ch := sub.Changed()
					if st := sub.Stats(); st.Faults[kvevents.FaultGone] > 0 && st.Connected {
						break
					}
					select {
					case <-ch:
					case <-deadline:
						t.Fatalf("subscriber never came back: %+v", sub.Stats())
					}
				}
			}
			if next(2) == 0 {
				s := next(uint64(len(sessions)))
				// A turn re-sends the session's history and adds to it.
				sessions[s] = append(sessions[s], ids(1000+step, 1+next(30))...)
				if len(sessions[s]) > 400 {
					sessions[s] = sessions[s][:40+next(60)]
				}
				r := hreq(e.s, sessions[s], "", 1+next(40), 1+next(2))
				if e.submit(r) == nil {
					live = append(live, r)
					all = append(all, r)
				}
			}
			if len(live) > 0 && next(30) == 0 {
				e.abort(live[next(uint64(len(live)))])
			}
			if next(10) == 0 {
				e.events.mu.Lock()
				e.events.dropped = true
				e.events.mu.Unlock()
			}
			e.step()
			if step%25 != 24 {
				continue
			}
			e.events.mu.Lock()
			n, last := len(e.events.buf), e.events.buf[len(e.events.buf)-1]
			e.events.mu.Unlock()
			if n == 0 || last.skip {
				continue // a dropped last batch is noticed only at the next
			}
			st := waitSeq(t, sub, last.seq)
			e.mu.Lock()
			if st.Blocks != len(e.cache.byHash) {
				t.Fatalf("map=%v step %d: index holds %d blocks, the cache %d", mapEnc, step, st.Blocks, len(e.cache.byHash))
			}
			for _, r := range all {
				got, ok := x.Cached(chainNames(intsOf(r.promptIDs), e.s.blockSize))
				if want := simCached(e, r); got != want || !ok {
					t.Fatalf("map=%v step %d: index has %d leading blocks of a prompt (whole %v), the cache %d", mapEnc, step, got, ok, want)
				}
			}
			e.mu.Unlock()
			checks++
		}
		st := sub.Stats()
		if checks < 10 || st.Replayed == 0 || st.Restarts+st.Faults[kvevents.FaultGone] == 0 {
			t.Fatalf("map=%v: %d checks, stats %+v: the test did not exercise replay and restart", mapEnc, checks, st)
		}
		cancel()
		<-done
		pub.close()
	}
}

func intsOf(ids []uint32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}
