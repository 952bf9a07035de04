package gpuinfo

import (
	"errors"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func mockLib(init nvml.Return, count int, dev *mock.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return init },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc:            func(r nvml.Return) string { return "code " + string(rune('0'+int(r)%10)) },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return count, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
		SystemGetProcessNameFunc: func(pid int) (string, nvml.Return) {
			if pid == 1 {
				return "", nvml.ERROR_NO_PERMISSION
			}
			return "proc", nvml.SUCCESS
		},
	}
}

// NVML's processes: compute and graphics merged by pid, a figure the
// driver withholds is -1, a name it withholds is empty; its failures are
// errors, its absence ErrNoGPU.
func TestNVMLDevices(t *testing.T) {
	dev := &mock.Device{
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 100, Used: 60, Free: 40}, nvml.SUCCESS
		},
		GetNameFunc: func() (string, nvml.Return) { return "H100", nvml.SUCCESS },
		GetUUIDFunc: func() (string, nvml.Return) { return "GPU-x", nvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 30}, {Pid: 1, UsedGpuMemory: math.MaxUint64}}, nvml.SUCCESS
		},
		GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 35}}, nvml.SUCCESS
		},
	}
	n, err := OpenNVML(mockLib(nvml.SUCCESS, 1, dev))
	if err != nil {
		t.Fatal(err)
	}
	devs, err := n.Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{{PID: 10, Name: "proc", Used: 35}, {PID: 1, Name: "", Used: -1}}
	if len(devs) != 1 || devs[0].UUID != "GPU-x" || devs[0].Free != 40 || len(devs[0].Processes) != 2 {
		t.Fatalf("%+v", devs)
	}
	for i, p := range devs[0].Processes {
		if p.PID != want[i].PID || p.Name != want[i].Name || p.Used != want[i].Used {
			t.Errorf("process %d: %+v, want %+v", i, p, want[i])
		}
	}

	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	if _, err := n.Devices(); err == nil || !strings.Contains(err.Error(), "compute processes") {
		t.Errorf("a lost GPU: %v", err)
	}

	for _, tc := range []struct {
		init   nvml.Return
		count  int
		noGPU  bool
		failed bool
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, 1, true, true},
		{nvml.ERROR_DRIVER_NOT_LOADED, 1, true, true},
		{nvml.SUCCESS, 0, true, true},
		{nvml.ERROR_UNKNOWN, 1, false, true},
	} {
		_, err := OpenNVML(mockLib(tc.init, tc.count, dev))
		if (err != nil) != tc.failed || errors.Is(err, ErrNoGPU) != tc.noGPU {
			t.Errorf("init %v, %d devices: %v", tc.init, tc.count, err)
		}
	}
}

// A process is known by the ports it, or a parent, listens on.
func TestListenPorts(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc here")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if ps := ListenPorts(os.Getpid()); !slices.Contains(ps, port) {
		t.Errorf("ListenPorts(self) = %v, want %d among them", ps, port)
	}
	if ps := ListenPorts(1 << 30); ps != nil {
		t.Errorf("a pid that does not exist: %v", ps)
	}
}

// What telling one process apart costs a reading: /proc/net/tcp{,6} and the
// fds of the process and its ancestors.
func BenchmarkListenPorts(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	pid := os.Getpid()
	b.Run("sockets read for the process", func(b *testing.B) {
		for b.Loop() {
			ListenPorts(pid)
		}
	})
	b.Run("sockets read once a reading", func(b *testing.B) {
		l := ReadListening()
		for b.Loop() {
			l.Ports(pid)
		}
	})
}
