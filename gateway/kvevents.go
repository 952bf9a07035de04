package gateway

import (
	"context"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/backends/kvevents"
)

// KV events. A backend configured with kv_events (the endpoint and topic
// vLLM was started with under --kv-events-config) has a subscriber that
// keeps an index of the blocks its GPU holds cached, named as the gateway
// names a prompt's blocks (prefix.go's chainStep, from the backend's first
// model's root), so that admission can bind a request where it must
// prefill least (admission.CacheView). The subscribers outlive a reload
// whose backend keeps its kv_events, so their indexes do too.

// KVEventsConfig is where a backend publishes vLLM's KV events.
type KVEventsConfig struct {
	// Endpoint is its PUB socket, e.g. tcp://10.0.0.5:5557 (vLLM's
	// endpoint, with the host it is reached at). Required.
	Endpoint string `yaml:"endpoint"`
	// Topic is its topic (vLLM's --kv-events-config topic). Default "".
	Topic string `yaml:"topic"`
	// Replay is its replay socket (vLLM's replay_endpoint), from which a
	// missed message is asked for again. Default none: a missed message
	// drops the index until it is whole again.
	Replay string `yaml:"replay_endpoint"`
	// Retry is the wait before dialling again a publisher gone. Default 1s.
	Retry Duration `yaml:"retry"`
}

// kvSub is one backend's running subscriber.
type kvSub struct {
	cfg   KVEventsConfig
	model string
	sub   *kvevents.Subscriber
	stop  context.CancelFunc
	done  chan struct{}
}

// kvWatch runs the subscribers, by backend name.
type kvWatch struct {
	mu   sync.Mutex
	subs map[string]*kvSub
}

func (w *kvWatch) get(backend string) *kvevents.Subscriber {
	w.mu.Lock()
	defer w.mu.Unlock()
	if k := w.subs[backend]; k != nil {
		return k.sub
	}
	return nil
}

// syncKVEvents starts the subscribers rt's backends ask for, keeps those
// that stay as they were, and stops the others; admission binds by cache
// while any runs. Called under reloadMu.
func (s *Server) syncKVEvents(rt *runtime) {
	w := &s.kv
	w.mu.Lock()
	if w.subs == nil {
		w.subs = map[string]*kvSub{}
	}
	want := map[string]bool{}
	var stopped []*kvSub
	for _, bc := range rt.cfg.Backends {
		if bc.KVEvents == nil {
			continue
		}
		want[bc.Name] = true
		if k := w.subs[bc.Name]; k != nil && k.cfg == *bc.KVEvents && k.model == bc.Models[0] {
			continue
		} else if k != nil {
			stopped = append(stopped, k)
		}
		chain := kvevents.Chain{Root: chainRoot(s.prefixSeed, bc.Models[0]), Step: s.kvStep()}
		sub := kvevents.NewSubscriber(kvevents.Config{Endpoint: bc.KVEvents.Endpoint, Topic: bc.KVEvents.Topic,
			Replay: bc.KVEvents.Replay, Retry: bc.KVEvents.Retry.D}, kvevents.NewIndex(chain), s.opt.Clock,
			s.log.With("backend", bc.Name))
		ctx, cancel := context.WithCancel(context.Background())
		k := &kvSub{cfg: *bc.KVEvents, model: bc.Models[0], sub: sub, stop: cancel, done: make(chan struct{})}
		go func() {
			defer close(k.done)
			_ = sub.Run(ctx)
		}()
		w.subs[bc.Name] = k
	}
	for name, k := range w.subs {
		if !want[name] {
			stopped = append(stopped, k)
			delete(w.subs, name)
		}
	}
	any := len(w.subs) > 0
	w.mu.Unlock()
	for _, k := range stopped {
		k.stop()
		<-k.done
	}
	if s.sched != nil {
		if any {
			s.sched.SetCacheView(cacheView{s})
		} else {
			s.sched.SetCacheView(nil)
		}
	}
}

// stopKVEvents stops every subscriber (shutdown).
func (s *Server) stopKVEvents() {
	w := &s.kv
	w.mu.Lock()
	subs := w.subs
	w.subs = nil
	w.mu.Unlock()
	for _, k := range subs {
		k.stop()
		<-k.done
	}
}

// kvStep is chainStep with the server's seed, for an index: called under
// the index's lock, one block at a time, so one buffer serves.
func (s *Server) kvStep() func(parent uint64, ids []uint32) uint64 {
	var buf []byte
	seed := s.prefixSeed
	return func(parent uint64, ids []uint32) uint64 {
		if cap(buf) < 8+4*len(ids) {
			buf = make([]byte, 0, 8+4*len(ids))
		}
		return chainStep(seed, buf, parent, ids)
	}
}

// cacheView is admission's view of the GPUs' caches: what the indexes of
// a GPU's backends with kv_events say. A GPU none of whose backends has
// one, or one whose index is not whole, cannot say.
type cacheView struct{ s *Server }

var _ admission.CacheView = cacheView{}

func (v cacheView) Cached(gpuID string, prefix []uint64) (int, bool) {
	rt := v.s.rt.Load()
	g := rt.gpuByID[gpuID]
	if g == nil {
		return 0, false
	}
	best, any := 0, false
	for _, b := range g.backends {
		sub := v.s.kv.get(b.Name())
		if sub == nil {
			continue
		}
		n, ok := sub.Index().Cached(prefix)
		if !ok {
			return 0, false
		}
		best, any = max(best, n), true
	}
	return best, any
}

// publishesKVEvents says whether a backend of model publishes KV events.
func publishesKVEvents(c *Config, model string) bool {
	for _, bc := range c.Backends {
		if bc.KVEvents != nil && slices.Contains(bc.Models, model) {
			return true
		}
	}
	return false
}

// noteKVCapacity tells b's index how many blocks its GPU caches, the
// horizon after which an index dropped for a missed message is whole.
func (s *Server) noteKVCapacity(b *backends.Backend, r backends.KVReport) {
	if sub := s.kv.get(b.Name()); sub != nil && r.NumGPUBlocks > 0 {
		sub.Index().SetCapacity(r.NumGPUBlocks)
	}
}

// kvEventsView is a subscriber's state on /status.
type kvEventsView struct {
	Endpoint  string            `json:"endpoint"`
	Topic     string            `json:"topic"`
	Connected bool              `json:"connected"`
	Whole     bool              `json:"whole"`
	Blocks    int               `json:"cached_blocks"`
	LastSeq   int64             `json:"last_seq"`
	Batches   uint64            `json:"batches"`
	Replayed  uint64            `json:"replayed"`
	Restarts  uint64            `json:"restarts"`
	Resets    uint64            `json:"resets"`
	Faults    map[string]uint64 `json:"faults"`
	LastFault string            `json:"last_fault,omitempty"`
}

func (s *Server) kvEventsStatus(backend string) *kvEventsView {
	s.kv.mu.Lock()
	k := s.kv.subs[backend]
	s.kv.mu.Unlock()
	if k == nil {
		return nil
	}
	st := k.sub.Stats()
	v := &kvEventsView{Endpoint: k.cfg.Endpoint, Topic: k.cfg.Topic, Connected: st.Connected, Whole: st.Whole, Blocks: st.Blocks,
		LastSeq: st.LastSeq, Batches: st.Batches, Replayed: st.Replayed, Restarts: st.Restarts, Resets: st.Resets,
		Faults: map[string]uint64{}, LastFault: st.LastFault}
	for _, f := range kvevents.Faults() {
		v.Faults[f.String()] = st.Faults[f]
	}
	return v
}

// kvEventsCollector exports the subscribers' state.
type kvEventsCollector struct{ w *kvWatch }

var (
	descKVConnected = def{"kvgate_kv_events_connected", "1 while the gateway is connected to the backend's KV-event publisher, else 0.", []string{"backend"}}.desc()
	descKVWhole     = def{"kvgate_kv_events_index_whole", "1 while the backend's index of cached blocks is whole (binding by cache uses it), 0 while it is rebuilt after a missed message.", []string{"backend"}}.desc()
	descKVBlocks    = def{"kvgate_kv_events_cached_blocks", "Blocks the backend's GPU holds cached, by its KV events.", []string{"backend"}}.desc()
	descKVBatches   = def{"kvgate_kv_events_batches_total", "KV-event batches applied to the backend's index, replayed ones included.", []string{"backend"}}.desc()
	descKVReplayed  = def{"kvgate_kv_events_replayed_total", "KV-event batches recovered from the backend's replay socket after a gap.", []string{"backend"}}.desc()
	descKVRestarts  = def{"kvgate_kv_events_restarts_total", "Times the backend's KV-event sequence started over (a new process, with an empty cache).", []string{"backend"}}.desc()
	descKVResets    = def{"kvgate_kv_events_resets_total", "Times the backend's index was dropped for a missed message, binding falling back to the gateway's own estimate until it is whole.", []string{"backend"}}.desc()
	descKVFaults    = def{"kvgate_kv_events_faults_total", "Faults of the backend's KV-event stream: publisher_gone, gap (a skipped sequence replay did not fill), garbage (a message that does not decode).", []string{"backend", "fault"}}.desc()
)

func (c *kvEventsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKVConnected, descKVWhole, descKVBlocks, descKVBatches, descKVReplayed, descKVRestarts, descKVResets, descKVFaults} {
		ch <- d
	}
}

func (c *kvEventsCollector) Collect(ch chan<- prometheus.Metric) {
	c.w.mu.Lock()
	subs := make(map[string]*kvevents.Subscriber, len(c.w.subs))
	for name, k := range c.w.subs {
		subs[name] = k.sub
	}
	c.w.mu.Unlock()
	b01 := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for name, sub := range subs {
		st := sub.Stats()
		ch <- prometheus.MustNewConstMetric(descKVConnected, prometheus.GaugeValue, b01(st.Connected), name)
		ch <- prometheus.MustNewConstMetric(descKVWhole, prometheus.GaugeValue, b01(st.Whole), name)
		ch <- prometheus.MustNewConstMetric(descKVBlocks, prometheus.GaugeValue, float64(st.Blocks), name)
		ch <- prometheus.MustNewConstMetric(descKVBatches, prometheus.CounterValue, float64(st.Batches), name)
		ch <- prometheus.MustNewConstMetric(descKVReplayed, prometheus.CounterValue, float64(st.Replayed), name)
		ch <- prometheus.MustNewConstMetric(descKVRestarts, prometheus.CounterValue, float64(st.Restarts), name)
		ch <- prometheus.MustNewConstMetric(descKVResets, prometheus.CounterValue, float64(st.Resets), name)
		for _, f := range kvevents.Faults() {
			ch <- prometheus.MustNewConstMetric(descKVFaults, prometheus.CounterValue, float64(st.Faults[f]), name, f.String())
		}
	}
}
