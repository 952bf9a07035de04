package main

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/backends/gpuinfo"
)

// kvgate gpus serves what the gateway's gpu_watch reads back, and says why
// when a reading fails; where there is no GPU it exits 1 saying so.
func TestGpus(t *testing.T) {
	var fail error
	srv := httptest.NewServer(gpusHandler(func() ([]gpuinfo.Device, error) {
		return []gpuinfo.Device{{Index: 0, UUID: "GPU-a", Total: 100, Used: 60, Free: 40,
			Processes: []gpuinfo.Process{{PID: 9, Name: "vllm", Used: 50, Ports: []int{8000}}}}}, fail
	}))
	defer srv.Close()
	devs, err := gpuinfo.Remote{URL: srv.URL + "/gpus", Client: srv.Client()}.Devices(context.Background())
	if err != nil || len(devs) != 1 || devs[0].Processes[0].Ports[0] != 8000 {
		t.Fatalf("%+v %v", devs, err)
	}
	fail = errors.New("GPU is lost")
	if _, err := (gpuinfo.Remote{URL: srv.URL + "/gpus", Client: srv.Client()}).Devices(context.Background()); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("a failed reading: %v", err)
	}
	if _, err := gpuinfo.Probe(); errors.Is(err, gpuinfo.ErrNoGPU) {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), []string{"gpus"}, &out, &errOut); code != exitNo || !strings.Contains(errOut.String(), "no NVIDIA GPU") {
			t.Errorf("no GPU: exit %d, %q", code, errOut.String())
		}
	}
}
