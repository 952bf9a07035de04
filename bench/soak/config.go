package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

func (s *soak) startSim(ctx context.Context, i int) error {
	p, err := s.kit.StartSimAt(ctx, fmt.Sprintf("sim%d", i), s.simAt[i], "--time-scale", strconv.FormatFloat(s.o.TimeScale, 'g', -1, 64),
		"--gpu-memory-utilization", "0.75", "--seed", strconv.Itoa(i+1))
	if err != nil {
		return err
	}
	s.sims[i] = p
	return nil
}

// writeConfig writes the gateway's config; gen varies a harmless value so
// that each reload really changes something. A broken config has an
// unknown key.
func (s *soak) writeConfig(gen int, broken bool) error {
	extra := ""
	if broken {
		extra = "    max_request: 1\n"
	}
	y := fmt.Sprintf(`listen: %s
admission:
  queue:
    timeout: %ds
%stenants:
  - {name: alpha, api_keys: [key-alpha], share: 0.7}
  - {name: beta, api_keys: [key-beta], share: 0.7, class: sheddable}
%sbackends:
%slog: {level: warn}
`, strings.TrimPrefix(s.gwURL, "http://"), 20+gen%2, extra, benchkit.ModelsYAML, s.backendsYAML())
	path, err := s.kit.WriteConfig("kvgate", y)
	s.cfg = path
	return err
}

// backendsYAML lists the simulators, each on a GPU of its own.
func (s *soak) backendsYAML() string {
	var b strings.Builder
	for i, at := range s.simAt {
		fmt.Fprintf(&b, "  - {name: sim%d, url: 'http://%s', models: [llama-3-8b], gpu_memory: 24GiB, health: {interval: 200ms, failures: 2, cooldown: 1s}, metrics: {interval: 200ms}}\n", i, at)
	}
	return b.String()
}

// hup sends SIGHUP and waits until the gateway has counted the reload:
// kvgate_config_reloads_total{result} reaching want.
func (s *soak) hup(result string, want int) error {
	_ = s.gw.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m, err := s.metrics(); err == nil && m.Sum("kvgate_config_reloads_total", result) >= float64(want) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("reload %d (%s) not counted within 10s", want, result)
}
