//go:build linux && cgo

// Command alloc holds memory on an NVIDIA GPU until it is told to stop: the
// "other process" of bench/gpu. It calls the CUDA driver API (libcuda.so.1,
// which every NVIDIA driver installs) through dlopen, so it needs no CUDA
// toolkit to build or run.
//
//	alloc --device 0 --mib 4096
//
// It prints "allocated N MiB" once the memory is held, then holds it until
// SIGTERM or SIGINT.
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>

typedef int (*cuInit_t)(unsigned int);
typedef int (*cuDeviceGet_t)(int *, int);
typedef int (*cuCtxCreate_t)(void **, unsigned int, int);
typedef int (*cuMemAlloc_t)(unsigned long long *, size_t);

// hold allocates bytes on device dev; 0 on success, else the CUDA error
// (or -1: no libcuda, -2: a symbol missing).
static int hold(int dev, size_t bytes) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) return -1;
	cuInit_t cuInit = (cuInit_t)dlsym(h, "cuInit");
	cuDeviceGet_t cuDeviceGet = (cuDeviceGet_t)dlsym(h, "cuDeviceGet");
	cuCtxCreate_t cuCtxCreate = (cuCtxCreate_t)dlsym(h, "cuCtxCreate_v2");
	cuMemAlloc_t cuMemAlloc = (cuMemAlloc_t)dlsym(h, "cuMemAlloc_v2");
	if (!cuInit || !cuDeviceGet || !cuCtxCreate || !cuMemAlloc) return -2;
	int r, d;
	void *ctx;
	unsigned long long p;
	if ((r = cuInit(0)) != 0) return r;
	if ((r = cuDeviceGet(&d, dev)) != 0) return r;
	if ((r = cuCtxCreate(&ctx, 0, d)) != 0) return r;
	if ((r = cuMemAlloc(&p, bytes)) != 0) return r;
	return 0;
}
*/
import "C"

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	dev := flag.Int("device", 0, "CUDA device index")
	mib := flag.Int64("mib", 1024, "MiB to hold")
	flag.Parse()
	if r := C.hold(C.int(*dev), C.size_t(*mib<<20)); r != 0 {
		fmt.Fprintf(os.Stderr, "alloc: holding %d MiB on device %d failed: CUDA error %d (-1: no libcuda.so.1, -2: a symbol missing)\n", *mib, *dev, int(r))
		os.Exit(1)
	}
	fmt.Printf("allocated %d MiB\n", *mib)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
