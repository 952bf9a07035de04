package gateway

import (
	"net/url"
	"strconv"
	"strings"
)

// GPUWatchConfig is the live view of each GPU's memory (gpuwatch.go): what
// every process holds on the GPU a backend runs on, the budget cut when the
// GPU's free memory falls below a floor, and the warnings that carry a
// snapshot. The source is chosen at start; a reload may change the rest.
type GPUWatchConfig struct {
	// Source is where the figures come from: auto (the default: NVML when
	// this host has an NVIDIA driver, else nothing is watched, said once at
	// start), nvml, off, or the http(s) URL of the GPU node's NVIDIA DCGM
	// exporter (/metrics: device totals only) or of `kvgate gpus --listen`
	// on the node (JSON, processes included).
	Source string `yaml:"source"`
	// Interval between readings, on the gateway's clock. Default 5s.
	Interval Duration `yaml:"interval"`
	// FreeFloor is the GPU memory that must stay free: the backend's
	// activations, CUDA graphs and allocator need it beyond its KV pool.
	// While a GPU's free memory is under it, the GPU's budget is cut by the
	// difference until it recovers. Default 1GiB; 0 turns the cut off.
	FreeFloor *Size `yaml:"free_floor"`
	// ResidueMin is how much of a GPU's used memory no listed process may
	// hold before it counts as residue (memory a finished or crashed
	// process left behind); the driver's own reservation stays under it.
	// Default 1GiB.
	ResidueMin *Size `yaml:"residue_min"`
}

// Sources of gpu_watch.
const (
	gpuSourceAuto = "auto"
	gpuSourceNVML = "nvml"
	gpuSourceOff  = "off"
)

func (w *GPUWatchConfig) defaults() { fillDefaults("gpu_watch", w) }

// validateGPUWatch fills and checks gpu_watch and the backends'
// gpu_device: backends on one GPU must name the same device.
func (c *Config) validateGPUWatch(p *problems) {
	w := &c.GPUWatch
	w.defaults()
	switch w.Source {
	case gpuSourceAuto, gpuSourceNVML, gpuSourceOff:
	default:
		u, err := url.Parse(w.Source)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.bad("gpu_watch.source", "%q is not auto, nvml, off or an http(s) URL of a DCGM exporter or of kvgate gpus", w.Source)
		}
	}
	p.dur("gpu_watch.interval", w.Interval)
	if w.Interval.Err() == nil && w.Interval.D <= 0 {
		p.bad("gpu_watch.interval", "must be > 0")
	}
	p.size("gpu_watch.free_floor", *w.FreeFloor)
	p.size("gpu_watch.residue_min", *w.ResidueMin)
	device := map[string]string{} // GPU → the device its first backend names
	for i, b := range c.Backends {
		if b.GPUDevice == "" {
			continue
		}
		f := "backends[" + strconv.Itoa(i) + "].gpu_device"
		if strings.TrimSpace(b.GPUDevice) != b.GPUDevice {
			p.bad(f, "%q: an index (0) or a UUID (GPU-...), without spaces", b.GPUDevice)
			continue
		}
		if d, ok := device[b.GPU]; ok && d != b.GPUDevice {
			p.bad(f, "%q, but another backend of GPU %q names %q: one GPU is one device", b.GPUDevice, b.GPU, d)
			continue
		}
		device[b.GPU] = b.GPUDevice
	}
}

// on says whether a source may be read at all.
func (w GPUWatchConfig) on() bool { return w.Source != gpuSourceOff }
