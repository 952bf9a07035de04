package gpuinfo

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoGPU means NVML is absent (no driver, no libnvidia-ml.so) or sees no
// device: the fallback case, not a failure.
var ErrNoGPU = errors.New("no NVIDIA GPU visible")

// Device is one GPU's identity and memory as the driver reports it.
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	Total int64  `json:"total_bytes"`
	Used  int64  `json:"used_bytes"` // by every process, this one included
	Free  int64  `json:"free_bytes"`
}

// Probe lists the visible GPUs.
func Probe() ([]Device, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_NO_PERMISSION {
			return nil, fmt.Errorf("%w: nvml init: %s", ErrNoGPU, nvml.ErrorString(ret))
		}
		return nil, fmt.Errorf("nvml init: %s", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", nvml.ErrorString(ret))
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: nvml found 0 devices", ErrNoGPU)
	}
	devs := make([]Device, 0, n)
	for i := range n {
		h, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d: %s", i, nvml.ErrorString(ret))
		}
		mem, ret := h.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d memory: %s", i, nvml.ErrorString(ret))
		}
		d := Device{Index: i, Total: int64(mem.Total), Used: int64(mem.Used), Free: int64(mem.Free)}
		d.Name, _ = h.GetName()
		d.UUID, _ = h.GetUUID()
		devs = append(devs, d)
	}
	return devs, nil
}
