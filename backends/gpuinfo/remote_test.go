package gpuinfo

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const dcgmPage = `# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 1000
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 80000
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 1000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 80000
# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 559
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 12
`

func TestParseDCGM(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		want       []Device
		err        string
	}{
		{"two devices, reserved on one", dcgmPage, []Device{
			{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3", Total: 81559 << 20, Used: 1000 << 20, Free: 80000 << 20},
			{Index: 1, UUID: "GPU-b", Name: "NVIDIA H100 80GB HBM3", Total: 81000 << 20, Used: 80000 << 20, Free: 1000 << 20},
		}, ""},
		{"used without free", "DCGM_FI_DEV_FB_USED{gpu=\"0\"} 5\n", nil, "no device with both"},
		{"no gpu label", "DCGM_FI_DEV_FB_USED{UUID=\"x\"} 5\nDCGM_FI_DEV_FB_FREE{UUID=\"x\"} 5\n", nil, "without a gpu label"},
		{"a negative size", "DCGM_FI_DEV_FB_USED{gpu=\"0\"} -5\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} 5\n", nil, "is not a size"},
		{"not the text format", "<html>", nil, "dcgm exporter text"},
		{"nothing", "", nil, "no device with both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDCGM(strings.NewReader(tc.page))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%+v", got)
			}
			for i := range got {
				if got[i].Index != tc.want[i].Index || got[i].UUID != tc.want[i].UUID || got[i].Name != tc.want[i].Name ||
					got[i].Total != tc.want[i].Total || got[i].Used != tc.want[i].Used || got[i].Free != tc.want[i].Free || got[i].Processes != nil {
					t.Errorf("device %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// Whatever an exporter answers, the parser errs or gives devices whose
// figures are sizes.
func FuzzParseDCGM(f *testing.F) {
	f.Add(dcgmPage)
	f.Add("DCGM_FI_DEV_FB_USED{gpu=\"0\"} 1e300\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} 5\n")
	f.Add("DCGM_FI_DEV_FB_USED{gpu=\"-1\"} 1\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} NaN\n")
	f.Fuzz(func(t *testing.T, page string) {
		devs, err := ParseDCGM(strings.NewReader(page))
		if err != nil {
			return
		}
		for _, d := range devs {
			if d.Used < 0 || d.Free < 0 || d.Total < d.Used+d.Free || d.Index < 0 {
				t.Fatalf("%+v from %q", d, page)
			}
		}
	})
}

// The source tells kvgate gpus' JSON from an exporter's text by content
// type.
func TestRemote(t *testing.T) {
	node := Nodes{Devices: []Device{{Index: 0, UUID: "GPU-a", Total: 10, Used: 6, Free: 4,
		Processes: []Process{{PID: 7, Name: "vllm", Used: 5, Ports: []int{8000}}}}}}
	mux := http.NewServeMux()
	mux.HandleFunc("/gpus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(node)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write([]byte(dcgmPage))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	devs, err := Remote{URL: srv.URL + "/gpus", Client: srv.Client()}.Devices(context.Background())
	if err != nil || len(devs) != 1 || len(devs[0].Processes) != 1 || devs[0].Processes[0].Ports[0] != 8000 {
		t.Errorf("json: %+v %v", devs, err)
	}
	devs, err = Remote{URL: srv.URL + "/metrics", Client: srv.Client()}.Devices(context.Background())
	if err != nil || len(devs) != 2 {
		t.Errorf("dcgm: %+v %v", devs, err)
	}
	if _, err := (Remote{URL: srv.URL + "/nope", Client: srv.Client()}).Devices(context.Background()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("404: %v", err)
	}
}
