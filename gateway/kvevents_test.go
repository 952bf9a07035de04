package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

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
