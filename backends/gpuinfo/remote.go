package gpuinfo

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The fields NVIDIA's DCGM exporter exports for a device's framebuffer, in
// MiB, labelled gpu (the index) and UUID. FB_RESERVED (newer exporters) is
// the driver's part: total = used + free + reserved.
const (
	dcgmUsed     = "DCGM_FI_DEV_FB_USED"
	dcgmFree     = "DCGM_FI_DEV_FB_FREE"
	dcgmReserved = "DCGM_FI_DEV_FB_RESERVED"
	mib          = 1 << 20
)

// Nodes is the JSON a node's `kvgate gpus --listen` serves: its devices,
// processes included.
type Nodes struct {
	Devices []Device `json:"devices"`
}

// maxRemoteBody bounds what a remote source may answer.
const maxRemoteBody = 8 << 20

// Remote reads devices from a GPU node over HTTP: NVIDIA's DCGM exporter
// (Prometheus text, device totals only) or `kvgate gpus --listen` (JSON,
// with processes), told apart by the answer's content type.
type Remote struct {
	URL    string
	Client *http.Client
}

// Devices fetches and parses the node's devices.
func (r Remote) Devices(ctx context.Context) ([]Device, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("gpu source %s: %w", r.URL, err)
	}
	req.Header.Set("Accept", "application/json, text/plain;q=0.9")
	resp, err := r.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gpu source: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("gpu source %s: status %d", r.URL, resp.StatusCode)
	}
	body := io.LimitReader(resp.Body, maxRemoteBody)
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		var n Nodes
		if err := json.NewDecoder(body).Decode(&n); err != nil {
			return nil, fmt.Errorf("gpu source %s: %w", r.URL, err)
		}
		return n.Devices, nil
	}
	devs, err := ParseDCGM(body)
	if err != nil {
		return nil, fmt.Errorf("gpu source %s: %w", r.URL, err)
	}
	return devs, nil
}

// ParseDCGM reads the devices of a DCGM exporter's /metrics: one per gpu
// label with both DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE, ordered by
// index. An exporter gives no processes.
func ParseDCGM(r io.Reader) ([]Device, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("dcgm exporter text: %w", err)
	}
	byIndex := map[int]*Device{}
	seen := map[int]int{} // index → fields found: 1 used, 2 free
	for _, field := range []string{dcgmUsed, dcgmFree, dcgmReserved} {
		f := fams[field]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			idx, uuid, name, ok := dcgmLabels(m)
			if !ok {
				return nil, fmt.Errorf("%s: a series without a gpu label", field)
			}
			v := m.GetGauge().GetValue()
			if m.GetGauge() == nil {
				v = m.GetUntyped().GetValue()
			}
			if math.IsNaN(v) || v < 0 || v > math.MaxInt64/mib {
				return nil, fmt.Errorf("%s{gpu=%q}: %v MiB is not a size", field, strconv.Itoa(idx), v)
			}
			d := byIndex[idx]
			if d == nil {
				d = &Device{Index: idx}
				byIndex[idx] = d
			}
			d.UUID, d.Name = cmp.Or(d.UUID, uuid), cmp.Or(d.Name, name)
			bytes := int64(v) * mib
			switch field {
			case dcgmUsed:
				d.Used, seen[idx] = bytes, seen[idx]|1
			case dcgmFree:
				d.Free, seen[idx] = bytes, seen[idx]|2
			case dcgmReserved:
				d.Total += bytes
			}
		}
	}
	var out []Device
	for idx, d := range byIndex {
		if seen[idx] != 3 {
			continue // a device whose used or free is not exported
		}
		d.Total += d.Used + d.Free
		out = append(out, *d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no device with both %s and %s", dcgmUsed, dcgmFree)
	}
	slices.SortFunc(out, func(a, b Device) int { return a.Index - b.Index })
	return out, nil
}

func dcgmLabels(m *dto.Metric) (idx int, uuid, name string, ok bool) {
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "gpu":
			n, err := strconv.Atoi(l.GetValue())
			if err != nil || n < 0 {
				return 0, "", "", false
			}
			idx, ok = n, true
		case "UUID":
			uuid = l.GetValue()
		case "modelName":
			name = l.GetValue()
		}
	}
	return idx, uuid, name, ok
}
