package admissiontest

import (
	"runtime"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// WaitQueued blocks until b has exactly n requests queued: the way to know
// that Acquire calls started in other goroutines have reached the queue.
// It has no timeout of its own; a test that never gets there hangs until
// `go test -timeout` says where.
func WaitQueued(b *admission.Budget, n int) {
	for i := 0; b.Stats().Queued != n; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
