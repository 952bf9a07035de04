package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/internal/benchkit"
)

func (s *soak) startSim(ctx context.Context, i int) error {
	m := s.sims[i]
	p, err := s.kit.StartSimAt(ctx, m.name, m.addr, "--time-scale", strconv.FormatFloat(s.o.TimeScale, 'g', -1, 64),
		"--gpu-memory-utilization", "0.75", "--on-overflow", "oom", "--seed", strconv.Itoa(i+1))
	if err != nil {
		return err
	}
	m.proc = p
	return nil
}

// writeConfig writes a replica's config: the simulators s.inConfig lists,
// the shared budget through the replica's proxy, and a harmless value
// that s.gen varies so that each reload really changes something. A broken
// config has an unknown key.
func (s *soak) writeConfig(r *replica, broken bool) error {
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
%sshared_budget: {redis: "redis://%s/0", replicas: 3, replica: %s, lease_ttl: %s}
log: {level: warn}
`, r.addr, 20+s.gen%2, extra, benchkit.ModelsYAML, s.backendsYAML(), r.proxy.Addr, r.name, s.o.leaseTTL)
	path, err := s.kit.WriteConfig(r.name, y)
	r.cfg = path
	return err
}

// backendsYAML lists the simulators in the configuration, each on a GPU
// of its own.
func (s *soak) backendsYAML() string {
	var b strings.Builder
	for i, m := range s.sims {
		if s.inConfig[i] {
			fmt.Fprintf(&b, "  - {name: %s, url: 'http://%s', models: [llama-3-8b], gpu_memory: 24GiB, health: {interval: 200ms, failures: 2, cooldown: 1s}, metrics: {interval: 200ms}}\n", m.name, m.addr)
		}
	}
	return b.String()
}

// reload writes every replica's config (broken or not) and sends each
// SIGHUP, together, as a configuration pushed to a fleet; it returns once
// every replica has counted its reload.
func (s *soak) reload(broken bool) error {
	if !broken {
		s.gen++
	}
	errs := make([]error, len(s.replicas))
	var wg sync.WaitGroup
	for i, r := range s.replicas {
		if err := s.writeConfig(r, broken); err != nil {
			return err
		}
		result, want := `result="ok"`, &r.reloadsOK
		if broken {
			result, want = `result="error"`, &r.reloadsBad
		}
		*want++
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.hup(r, result, *want) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// hup sends SIGHUP to a replica and waits until it has counted the
// reload: kvgate_config_reloads_total{result} reaching want. SIGHUPs sent
// together may be read as one.
func (s *soak) hup(r *replica, result string, want int) error {
	_ = r.proc.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m, err := s.metrics(r); err == nil && m.Sum("kvgate_config_reloads_total", result) >= float64(want) {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("%s: reload %d (%s) not counted within 10s", r.name, want, result)
}
