package benchkit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

// Model is the model every benchmark serves: Llama-3-8B, which kvgate sim
// simulates by default.
const Model = "llama-3-8b"

// ModelsYAML is the models section of a gateway config serving Model.
const ModelsYAML = `models:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
`

// ModelsYAMLBackendTokenizer is ModelsYAML with the prompt counted by the
// backend's own tokenizer, as a gateway in front of a real vLLM does.
const ModelsYAMLBackendTokenizer = ModelsYAML + "    tokenizer: backend\n"

// WriteConfig writes a gateway's config as name.yaml in the run's
// directory and returns its path. It writes a file aside and renames it,
// so that a gateway reloading on SIGHUP never reads half of one.
func (k *Kit) WriteConfig(name, yaml string) (string, error) {
	path := k.Path(name + ".yaml")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// Serve starts kvgate serve with the config at path, which listens at
// addr, and waits until it is ready.
func (k *Kit) Serve(ctx context.Context, logName, addr, path string) (*Process, error) {
	return k.Start(ctx, logName, addr, "serve", "--config", path)
}

// StartGateway starts kvgate serve on a free loopback port in front of the
// simulator at simURL, serving Model on one GPU of 24 GiB at ceiling, with
// long request and queue timeouts (a benchmark's load must not time out).
// admission is YAML appended under admission: (each line indented by two
// spaces), top YAML appended at the top level (tenants:, ...). Its config
// is name.yaml in the run's directory, its log name-gateway.log.
func (k *Kit) StartGateway(ctx context.Context, name, simURL, ceiling, admission, top string) (*Process, error) {
	return k.StartGatewayOver(ctx, name, ceiling, admission, top, fmt.Sprintf(`  - name: sim0
    url: %s
    models: [%s]
    gpu_memory: 24GiB
`, simURL, Model))
}

// StartGatewayOver is StartGateway in front of backends: the items of its
// config's backends: list, each line indented by two spaces.
func (k *Kit) StartGatewayOver(ctx context.Context, name, ceiling, admission, top, backends string) (*Process, error) {
	return k.StartGatewayModels(ctx, name, ceiling, admission, top, ModelsYAML, backends)
}

// StartGatewayModels is StartGatewayOver with its own models section
// (ModelsYAML with more keys of the model, say).
func (k *Kit) StartGatewayModels(ctx context.Context, name, ceiling, admission, top, models, backends string) (*Process, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	path, err := k.WriteConfig(Slug(name), fmt.Sprintf(`listen: %s
server: {request_timeout: 30m}
admission:
  ceiling: %s
  queue: {timeout: 20m}
%s%s%sbackends:
%s`, addr, ceiling, admission, top, models, backends))
	if err != nil {
		return nil, err
	}
	return k.Serve(ctx, Slug(name)+"-gateway", addr, path)
}

// Status reads a gateway's /status into v, a struct of the fields the
// benchmark looks at.
func Status(ctx context.Context, c *http.Client, gatewayURL string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, gatewayURL+"/status", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/status: status %d", gatewayURL, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s/status: %w", gatewayURL, err)
	}
	return nil
}
