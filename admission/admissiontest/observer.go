package admissiontest

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// Event is one Observer call. Reason is "" for an admission.
type Event struct {
	Admitted   bool
	Queue      string
	GPU        string
	Class      string
	Tenant     string
	Reason     string
	Weight     int64
	Waited     time.Duration
	Backfilled bool
	Preemptive bool
}

func (e Event) String() string {
	if e.Admitted {
		bf := ""
		if e.Backfilled {
			bf = " backfilled"
		}
		if e.Preemptive {
			bf += " preemptive"
		}
		return fmt.Sprintf("admitted %s/%s/%s on %q w=%d waited=%v%s", e.Queue, e.Class, e.Tenant, e.GPU, e.Weight, e.Waited, bf)
	}
	return fmt.Sprintf("rejected %s/%s/%s %s w=%d waited=%v", e.Queue, e.Class, e.Tenant, e.Reason, e.Weight, e.Waited)
}

// Recorder is an admission.Observer that keeps a transcript of its calls.
// The zero value is ready; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

var _ admission.Observer = (*Recorder)(nil)

func (r *Recorder) Admitted(e admission.Event) {
	r.add(Event{Admitted: true, Queue: e.Queue, GPU: e.GPU, Class: e.Class, Tenant: e.Tenant, Weight: e.Weight,
		Waited: e.Waited, Backfilled: e.Backfilled, Preemptive: e.Preemptive})
}

func (r *Recorder) Rejected(e admission.Event, reason string) {
	r.add(Event{Queue: e.Queue, Class: e.Class, Tenant: e.Tenant, Reason: reason, Weight: e.Weight, Waited: e.Waited})
}

func (r *Recorder) add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events is a copy of the transcript so far.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}
