package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The GPU memory watch's series (gpuwatch.go), read from its last reading at
// scrape time. They exist only while a source is watched: without one,
// /metrics is as it was. A process's series lives as long as the process
// holds memory on the GPU; the rest exist for every GPU matched to a device.
var (
	defGPUMemTotal  = def{"kvgate_gpu_memory_total_bytes", "The GPU's memory, as the GPU memory watch last read it.", []string{"gpu"}}
	defGPUMemUsed   = def{"kvgate_gpu_memory_used_bytes", "The GPU's memory in use by every process, the backends' included.", []string{"gpu"}}
	defGPUMemFree   = def{"kvgate_gpu_memory_free_bytes", "The GPU's free memory.", []string{"gpu"}}
	defGPUMemFloor  = def{"kvgate_gpu_memory_free_floor_bytes", "gpu_watch.free_floor: the free memory under which the GPU's budget is cut.", []string{"gpu"}}
	defGPUMemBelow  = def{"kvgate_gpu_memory_below_floor", "1 while the GPU's free memory is under the floor and its budget is cut, 0 otherwise.", []string{"gpu"}}
	defGPUMemCut    = def{"kvgate_gpu_memory_budget_cut_bytes", "What the GPU's KV budget is cut by now: the free memory missing under the floor.", []string{"gpu"}}
	defGPUMemOther  = def{"kvgate_gpu_memory_other_bytes", "Memory held on the GPU by processes other than its backends.", []string{"gpu"}}
	defGPUMemUnattr = def{"kvgate_gpu_memory_unattributed_bytes", "Used memory no listed process holds: residue of finished or crashed processes, and the driver's own part (0 where the source lists no processes).", []string{"gpu"}}
	defGPUProcMem   = def{"kvgate_gpu_process_memory_bytes", "Memory a process holds on the GPU; owner is backend (behind a backend's port) or other.", []string{"gpu", "pid", "process", "owner"}}
	defGPUEvents    = def{"kvgate_gpu_memory_events_total", "Warnings the GPU memory watch logged with a snapshot: contention, below_floor, residue, pool_shrunk, oom.", []string{"gpu", "event"}}
	defGPUReadErrs  = def{"kvgate_gpu_watch_errors_total", "Readings of the GPU memory source that failed.", nil}
)

// gpuCollector exports the watch's last reading; current is the running
// configuration, whose GPUs have their event counters from the start, so
// that increase() sees a GPU's first event.
type gpuCollector struct {
	w       *gpuWatch
	current func() *runtime
}

var gpuDefs = []def{defGPUMemTotal, defGPUMemUsed, defGPUMemFree, defGPUMemFloor, defGPUMemBelow, defGPUMemCut, defGPUMemOther,
	defGPUMemUnattr, defGPUProcMem, defGPUEvents, defGPUReadErrs}

func (c gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range gpuDefs {
		ch <- d.desc()
	}
}

func (c gpuCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.w
	w.mu.Lock()
	defer w.mu.Unlock()
	gauge := func(d def, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.desc(), prometheus.GaugeValue, v, labels...)
	}
	ch <- prometheus.MustNewConstMetric(defGPUReadErrs.desc(), prometheus.CounterValue, float64(w.errors))
	if rt := c.current(); rt != nil {
		for name := range rt.gpus {
			if w.gpus[name] == nil {
				for _, e := range gpuEvents {
					ch <- prometheus.MustNewConstMetric(defGPUEvents.desc(), prometheus.CounterValue, 0, name, e)
				}
			}
		}
	}
	for name, st := range w.gpus {
		for _, e := range gpuEvents {
			ch <- prometheus.MustNewConstMetric(defGPUEvents.desc(), prometheus.CounterValue, float64(st.events[e]), name, e)
		}
		if st.dev == nil {
			continue
		}
		gauge(defGPUMemTotal, float64(st.dev.Total), name)
		gauge(defGPUMemUsed, float64(st.dev.Used), name)
		gauge(defGPUMemFree, float64(st.dev.Free), name)
		gauge(defGPUMemFloor, float64(st.floor), name)
		gauge(defGPUMemBelow, boolFloat(st.below), name)
		gauge(defGPUMemCut, float64(st.cut), name)
		gauge(defGPUMemOther, float64(st.other), name)
		gauge(defGPUMemUnattr, float64(st.unattr), name)
		for _, p := range st.procs {
			if p.Used < 0 {
				continue // the driver did not say
			}
			owner := "other"
			if p.Own {
				owner = "backend"
			}
			gauge(defGPUProcMem, float64(p.Used), name, strconv.Itoa(p.PID), p.Name, owner)
		}
	}
}
