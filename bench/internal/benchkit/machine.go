package benchkit

import (
	"os"
	"strings"
)

// CPUModel is the machine's CPU as /proc/cpuinfo names it, "" where it
// does not: a benchmark states the machine it ran on.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// LoadAverage is the machine's load average over the last minute, ""
// where /proc/loadavg cannot say: other work on the machine slows the
// simulators and the gateway, and the figures with them.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return ""
}
