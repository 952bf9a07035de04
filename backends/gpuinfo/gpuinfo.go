package gpuinfo

import (
	"errors"
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoGPU means NVML is absent (no driver, no libnvidia-ml.so) or sees no
// device: the fallback case, not a failure.
var ErrNoGPU = errors.New("no NVIDIA GPU visible")

// Device is one GPU's identity and memory as the driver (or an exporter)
// reports it.
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	Total int64  `json:"total_bytes"`
	Used  int64  `json:"used_bytes"` // by every process, this one included
	Free  int64  `json:"free_bytes"`
	// Processes are those holding memory on the device, as NVML lists them
	// (compute and graphics contexts); nil where the source gives no
	// processes (an exporter's device totals).
	Processes []Process `json:"processes,omitempty"`
}

// Process is one process holding memory on a device.
type Process struct {
	PID  int    `json:"pid"`
	Name string `json:"name"`
	// Used is its memory on the device; -1 where the driver will not say
	// (NVML's VALUE_NOT_AVAILABLE: a container without the host's PID
	// namespace, Windows' WDDM).
	Used int64 `json:"used_bytes"`
	// Ports are the TCP ports the process or one of its ancestors listens
	// on, as this host's /proc shows them: how a backend's own process (the
	// one behind its URL's port, or the engine it forked) is told apart from
	// the others. Empty where the process is not visible here.
	Ports []int `json:"ports,omitempty"`
}

// Probe lists the visible GPUs, without their processes.
func Probe() ([]Device, error) {
	n, err := OpenNVML(nvml.New())
	if err != nil {
		return nil, err
	}
	defer n.Close()
	return n.read(false)
}

// NVML reads devices through an initialised NVML library: the real one
// (nvml.New()) or, in tests, go-nvml's mock.
type NVML struct{ lib nvml.Interface }

// OpenNVML initialises lib. A missing library or driver, or no device, is
// ErrNoGPU (the fallback case); any other failure is an error of its own.
func OpenNVML(lib nvml.Interface) (*NVML, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_NO_PERMISSION {
			return nil, fmt.Errorf("%w: nvml init: %s", ErrNoGPU, lib.ErrorString(ret))
		}
		return nil, fmt.Errorf("nvml init: %s", lib.ErrorString(ret))
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("nvml device count: %s", lib.ErrorString(ret))
	}
	if n == 0 {
		lib.Shutdown()
		return nil, fmt.Errorf("%w: nvml found 0 devices", ErrNoGPU)
	}
	return &NVML{lib: lib}, nil
}

// Close shuts the library down.
func (n *NVML) Close() { n.lib.Shutdown() }

// Devices reads every device's memory and the processes holding it, each
// with the ports it listens on (ListenPorts).
func (n *NVML) Devices() ([]Device, error) { return n.read(true) }

func (n *NVML) read(processes bool) ([]Device, error) {
	lib := n.lib
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", lib.ErrorString(ret))
	}
	var listening Listening
	if processes {
		listening = ReadListening() // once for every process of the reading
	}
	devs := make([]Device, 0, count)
	for i := range count {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d: %s", i, lib.ErrorString(ret))
		}
		mem, ret := h.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d memory: %s", i, lib.ErrorString(ret))
		}
		d := Device{Index: i, Total: int64(mem.Total), Used: int64(mem.Used), Free: int64(mem.Free)}
		d.Name, _ = h.GetName()
		d.UUID, _ = h.GetUUID()
		if processes {
			ps, err := n.processes(h, listening)
			if err != nil {
				return nil, fmt.Errorf("nvml device %d: %w", i, err)
			}
			d.Processes = ps
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// processes lists the compute and graphics processes of a device, a
// process that has both counted once (with the larger figure).
func (n *NVML) processes(h nvml.Device, listening Listening) ([]Process, error) {
	compute, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("compute processes: %s", n.lib.ErrorString(ret))
	}
	graphics, ret := h.GetGraphicsRunningProcesses()
	if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("graphics processes: %s", n.lib.ErrorString(ret))
	}
	out := []Process{}
	at := map[int]int{}
	for _, p := range append(compute, graphics...) {
		// NVML's VALUE_NOT_AVAILABLE is -1 as an unsigned field.
		used := int64(p.UsedGpuMemory)
		if p.UsedGpuMemory == math.MaxUint64 || used < 0 {
			used = -1
		}
		pid := int(p.Pid)
		if i, ok := at[pid]; ok {
			out[i].Used = max(out[i].Used, used)
			continue
		}
		name, ret := n.lib.SystemGetProcessName(pid)
		if ret != nvml.SUCCESS {
			name = ""
		}
		at[pid] = len(out)
		out = append(out, Process{PID: pid, Name: name, Used: used, Ports: listening.Ports(pid)})
	}
	return out, nil
}
