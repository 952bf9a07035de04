//go:build pprof

package main

import (
	"net/http"
	_ "net/http/pprof" // the profiles, on KVGATE_PPROF's address
	"os"
)

// A profiling build (go build -tags pprof) serves net/http/pprof on the
// address in KVGATE_PPROF, for bench/overhead's --pprof; the release build
// has no such listener.
func init() {
	if addr := os.Getenv("KVGATE_PPROF"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
