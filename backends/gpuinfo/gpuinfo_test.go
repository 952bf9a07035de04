package gpuinfo

import (
	"errors"
	"testing"
)

// On machines without a driver (CI) Probe must fail cleanly with ErrNoGPU;
// on a GPU machine it must report sane memory figures.
func TestProbe(t *testing.T) {
	devs, err := Probe()
	if err != nil {
		if !errors.Is(err, ErrNoGPU) {
			t.Fatalf("Probe: %v (want ErrNoGPU where there is no GPU)", err)
		}
		t.Logf("no GPU here, fallback path: %v", err)
		return
	}
	for _, d := range devs {
		if d.Total <= 0 || d.Used < 0 || d.Free < 0 || d.Used+d.Free > d.Total+(1<<30) {
			t.Errorf("device %d: implausible memory %+v", d.Index, d)
		}
	}
}
