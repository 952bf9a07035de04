package gateway

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/backends/sim"
)

// kvSim is a simulator that publishes its KV events, in map or vLLM's
// positional encoding, with a replay socket.
func kvSim(t *testing.T, mapEnc bool) (*sim.Server, string) {
	t.Helper()
	return startSim(t, func(c *sim.Config) {
		c.TimeScale = 0.01
		c.KVEvents = &sim.KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", MapEncoding: mapEnc}
	})
}

func kvEventsYAML(s *sim.Server) string {
	return fmt.Sprintf("    kv_events: {endpoint: \"tcp://%s\", replay_endpoint: \"tcp://%s\", topic: kv, retry: 20ms}\n", s.KVEventsAddr(), s.KVEventsReplayAddr())
}

// A prompt another client left cached on the smaller GPU draws the
// gateway's request there: without KV events it would go where there is
// most room.
func TestKVEventsBindWhereThePromptIsCached(t *testing.T) {
	small, smallURL := kvSim(t, false)
	big, bigURL := kvSim(t, true)
	cfg := fleetConfig("", smallURL+" 24GiB", bigURL+" 80GiB")
	cfg = strings.Replace(cfg, "    metrics: {interval: 50ms}\n  - name: gpu1", "    metrics: {interval: 50ms}\n"+kvEventsYAML(small)+"  - name: gpu1", 1)
	cfg += kvEventsYAML(big)
	s, gw := startGateway(t, cfg, Options{})
	eventually(t, "both backends' reports", func() bool {
		rt := s.rt.Load()
		_, _, a := rt.gpus["gpu0"].reported()
		_, _, b := rt.gpus["gpu1"].reported()
		return a && b
	})
	eventually(t, "both subscribers connected", func() bool {
		st := statusOf(t, gw)
		return st.Backends[0].KVEvents != nil && st.Backends[0].KVEvents.Connected && st.Backends[1].KVEvents != nil && st.Backends[1].KVEvents.Connected
	})

	prompt := words(1500)
	// Another client, straight to the small GPU's backend.
	if r := postJSON(smallURL, "/v1/chat/completions", chatBody(prompt, 4, false)); r.err != nil || r.status != 200 {
		t.Fatalf("direct request: %v %d %s", r.err, r.status, r.body)
	}
	eventually(t, "the small GPU's index to hold the prompt", func() bool {
		st := statusOf(t, gw)
		kv := st.Backends[0].KVEvents
		return kv.Whole && kv.Blocks >= 1500/16
	}, func() string { return fmt.Sprintf("%+v", statusOf(t, gw).Backends[0].KVEvents) })

	hitsBefore := small.Stats().PrefixCacheHits
	if r := postJSON(gw, "/v1/chat/completions", chatBody(prompt, 4, false)); r.err != nil || r.status != 200 {
		t.Fatalf("through the gateway: %v %d %s", r.err, r.status, r.body)
	}
	if hits := small.Stats().PrefixCacheHits - hitsBefore; hits < 1400 {
		t.Fatalf("the small GPU's cache served %d prompt tokens of the request, want it bound there (small %+v, big %+v)", hits, small.Stats(), big.Stats())
	}

	st := statusOf(t, gw)
	for i, b := range st.Backends {
		kv := b.KVEvents
		if kv == nil || !kv.Connected || !kv.Whole || kv.Faults["gap"] != 0 || kv.Faults["garbage"] != 0 {
			t.Fatalf("backend %d's subscriber on /status: %+v", i, kv)
		}
	}
	resp, err := http.Get(gw + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvgate_kv_events_index_whole{backend="gpu0"} 1`, `kvgate_kv_events_faults_total{backend="gpu1",fault="gap"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestKVEventsConfigErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"    kv_events: {topic: kv}\n", "backends[0].kv_events.endpoint: required"},
		{"    kv_events: {endpoint: \"http://x:1\"}\n", `backends[0].kv_events.endpoint: "http://x:1" is not a tcp:// or ipc:// address`},
		{"    kv_events: {endpoint: \"tcp://x:1\", replay_endpoint: \"x:2\"}\n", `backends[0].kv_events.replay_endpoint: "x:2" is not a tcp:// or ipc:// address`},
		{"    kv_events: {endpoint: \"tcp://x:1\", tpoic: kv}\n", "tpoic"},
	} {
		cfg := strings.Replace(baseConfig("http://127.0.0.1:1", ""), "    metrics: {interval: 50ms}\n", "    metrics: {interval: 50ms}\n"+tc.yaml, 1)
		if _, err := Parse([]byte(cfg), "."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// rawPub is a KV-event publisher kvgate did not write: a bare ZeroMQ PUB
// socket sending whatever frames a test gives it.
type rawPub struct {
	t    *testing.T
	sock zmq4.Socket
	addr string
}

func listenRawPub(t *testing.T, addr string) *rawPub {
	t.Helper()
	p := zmq4.NewPub(context.Background())
	if err := p.Listen(addr); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { p.Close() })
	return &rawPub{t: t, sock: p, addr: "tcp://" + p.Addr().String()}
}

// send sends [kv, seq, payload] once the gateway's subscription has reached
// the socket (PUB drops what it sends before).
func (p *rawPub) send(seq int64, payload []byte) {
	p.t.Helper()
	tp := p.sock.(interface{ Topics() []string })
	eventually(p.t, "the gateway subscribed", func() bool { return len(tp.Topics()) > 0 })
	if err := p.sock.SendMulti(zmq4.NewMsgFrom([]byte("kv"), binary.BigEndian.AppendUint64(nil, uint64(seq)), payload)); err != nil {
		p.t.Fatal(err)
	}
}

// storedBatch is a positional batch storing one block of 16 token ids.
func storedBatch(t *testing.T, hash int64) []byte {
	t.Helper()
	ids := make([]any, 16)
	for i := range ids {
		ids[i] = i + 1
	}
	b, err := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", []any{hash}, nil, ids, 16, nil, "GPU"}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each fault of a publisher's stream (a garbage frame, a gap, the publisher
// gone) drops the GPU's index: binding falls back to the gateway's own
// estimate, requests are still answered, and the fault is counted on
// /status and /metrics; the publisher's restart makes the index whole
// again, and binding uses it again.
func TestKVEventsFaultsFallBackAndRecover(t *testing.T) {
	_, simURL := startSim(t, nil)
	pub := listenRawPub(t, "tcp://127.0.0.1:0")
	cfg := fleetConfig(fmt.Sprintf("    kv_events: {endpoint: %q, topic: kv, retry: 20ms}\n", pub.addr), simURL)
	s, gw := startGateway(t, cfg, Options{})
	view := cacheView{s}
	kv := func() *kvEventsView { return statusOf(t, gw).Backends[0].KVEvents }
	state := func() string { return fmt.Sprintf("%+v", kv()) }
	whole := func(what string, restarts uint64) {
		t.Helper()
		eventually(t, what, func() bool { k := kv(); return k.Connected && k.Whole && k.Restarts == restarts && k.Blocks == 1 }, state)
		if _, ok := view.Cached("gpu0", nil); !ok {
			t.Fatalf("%s: binding does not use the index", what)
		}
	}
	dropped := func(what string, cond func(*kvEventsView) bool) {
		t.Helper()
		eventually(t, what, func() bool { k := kv(); return !k.Whole && cond(k) }, state)
		if _, ok := view.Cached("gpu0", nil); ok {
			t.Fatalf("%s: binding still relies on the index", what)
		}
		if r := postJSON(gw, "/v1/chat/completions", chatBody("hello there", 4, false)); r.err != nil || r.status != 200 {
			t.Fatalf("%s: a request on the estimate: %v %d %s", what, r.err, r.status, r.body)
		}
	}

	pub.send(0, storedBatch(t, 1))
	whole("the stream from its start", 0)

	pub.send(1, []byte{0x93, 0xc1, 0xc1})
	dropped("a garbage frame", func(k *kvEventsView) bool { return k.Faults["garbage"] == 1 })
	pub.send(0, storedBatch(t, 2)) // the publisher restarted
	whole("a restart after the garbage", 1)

	pub.send(2, storedBatch(t, 3)) // sequence 1 never came, and no replay socket
	dropped("a gap", func(k *kvEventsView) bool { return k.Faults["gap"] == 1 })
	pub.send(0, storedBatch(t, 4))
	whole("a restart after the gap", 2)

	addr := strings.TrimPrefix(pub.addr, "tcp://")
	pub.sock.Close()
	dropped("the publisher gone", func(k *kvEventsView) bool { return k.Faults["publisher_gone"] >= 1 && !k.Connected })
	pub = listenRawPub(t, "tcp://"+addr)
	pub.send(0, storedBatch(t, 5))
	eventually(t, "back after the publisher returned", func() bool { k := kv(); return k.Connected && k.Whole && k.Blocks == 1 }, state)

	resp, err := http.Get(gw + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`kvgate_kv_events_faults_total{backend="gpu0",fault="garbage"} 1`,
		`kvgate_kv_events_faults_total{backend="gpu0",fault="gap"} 1`,
		`kvgate_kv_events_index_whole{backend="gpu0"} 1`,
		`kvgate_kv_events_connected{backend="gpu0"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if k := kv(); k.Faults["publisher_gone"] < 1 || k.Resets < 3 || k.LastFault == "" {
		t.Errorf("/status after the faults: %+v", k)
	}
}
