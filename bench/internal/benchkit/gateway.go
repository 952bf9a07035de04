package benchkit

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Main runs a benchmark's run until it returns or the process is
// interrupted, and exits non-zero, naming the benchmark, when it fails.
func Main(name string, run func(context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// StartGateway starts kvgate serve on a free loopback port in front of the
// simulator at simURL, serving Model on one GPU of 24 GiB at ceiling, with
// long request and queue timeouts (a benchmark's load must not time out).
// admission is YAML appended under admission: (each line indented by two
// spaces), top YAML appended at the top level (tenants:, ...). Its config
// is name.yaml in the run's directory, its log name-gateway.log.
func (k *Kit) StartGateway(ctx context.Context, name, simURL, ceiling, admission, top string) (*Process, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:%d
server: {request_timeout: 30m}
admission:
  ceiling: %s
  queue: {timeout: 20m}
%s%s%sbackends:
  - name: sim0
    url: %s
    models: [%s]
    gpu_memory: 24GiB
`, port, ceiling, admission, top, ModelsYAML, simURL, Model)
	path := k.Path(Slug(name) + ".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	return k.Start(ctx, Slug(name)+"-gateway", fmt.Sprintf("http://127.0.0.1:%d", port), "serve", "--config", path)
}
