package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kvgate/kvgate/backends/gpuinfo"
)

// runGpus prints, or serves, this node's GPUs as NVML sees them: per device
// its memory and the processes holding it, each with the ports it (or a
// parent) listens on. A gateway that runs elsewhere reads it with
// gpu_watch.source: http://NODE:PORT/gpus.
func runGpus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("gpus", "[--listen ADDR]", stdout, stderr)
	listen := fs.String("listen", "", "serve GET /gpus (JSON) on this address instead of printing once, e.g. :9401")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	n, err := gpuinfo.OpenNVML(nvml.New())
	if err != nil {
		code := exitNo
		if !errors.Is(err, gpuinfo.ErrNoGPU) {
			code = exitUsage
		}
		return fail(stderr, "gpus", code, "%v", err)
	}
	defer n.Close()
	if *listen == "" {
		devs, err := n.Devices()
		if err != nil {
			return fail(stderr, "gpus", exitNo, "%v", err)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(gpuinfo.Nodes{Devices: devs})
		return exitOK
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(stderr, "gpus", exitUsage, "--listen: %v", err)
	}
	srv := &http.Server{Handler: gpusHandler(n.Devices), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	slog.New(slog.NewTextHandler(stderr, nil)).Info("kvgate gpus serving", "addr", ln.Addr().String(), "path", "/gpus")
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fail(stderr, "gpus", exitNo, "%v", err)
	}
	return exitOK
}

// gpusHandler answers GET /gpus with a fresh reading; a reading that fails
// is a 503 that says why.
func gpusHandler(read func() ([]gpuinfo.Device, error)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /gpus", func(w http.ResponseWriter, r *http.Request) {
		devs, err := read()
		if err != nil {
			http.Error(w, fmt.Sprintf("reading the GPUs: %v", err), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(gpuinfo.Nodes{Devices: devs})
	})
	return mux
}
