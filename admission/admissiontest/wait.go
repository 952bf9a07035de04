package admissiontest

import (
	"runtime"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// WaitQueued blocks until s has exactly n requests queued: the way to know
// that Acquire calls started in other goroutines have reached the queue.
// It has no timeout of its own; a test that never gets there hangs until
// `go test -timeout` says where.
func WaitQueued(s *admission.Scheduler, n int) {
	for i := 0; s.Stats().Queued != n; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
