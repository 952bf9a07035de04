package admissiontest

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/admission"
)

// Event is one Observer call. Reason is "" for an admission.
type Event struct {
	Admitted bool
	Class    string
	Tenant   string
	Reason   string
	Weight   int64
	Waited   time.Duration
}

func (e Event) String() string {
	if e.Admitted {
		return fmt.Sprintf("admitted %s/%s w=%d waited=%v", e.Class, e.Tenant, e.Weight, e.Waited)
	}
	return fmt.Sprintf("rejected %s/%s %s w=%d waited=%v", e.Class, e.Tenant, e.Reason, e.Weight, e.Waited)
}

// Recorder is an admission.Observer that keeps a transcript of its calls.
// The zero value is ready; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

var _ admission.Observer = (*Recorder)(nil)

func (r *Recorder) Admitted(class, tenant string, weight int64, waited time.Duration) {
	r.add(Event{Admitted: true, Class: class, Tenant: tenant, Weight: weight, Waited: waited})
}

func (r *Recorder) Rejected(class, tenant, reason string, weight int64, waited time.Duration) {
	r.add(Event{Class: class, Tenant: tenant, Reason: reason, Weight: weight, Waited: waited})
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
