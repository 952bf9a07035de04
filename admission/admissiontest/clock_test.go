package admissiontest_test

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/admission/admissiontest"
)

func TestClockFiresInDeadlineOrderAtTheirDeadlines(t *testing.T) {
	start := time.Unix(1000, 0)
	c := admissiontest.NewClock(start)
	var mu sync.Mutex
	var fired []string
	at := map[string]time.Duration{}
	add := func(name string, d time.Duration) {
		c.AfterFunc(d, func() {
			mu.Lock()
			defer mu.Unlock()
			fired = append(fired, name)
			at[name] = c.Now().Sub(start)
		})
	}
	add("c", 3*time.Second)
	add("a", time.Second)
	add("b1", 2*time.Second)
	add("b2", 2*time.Second) // same deadline: creation order
	stopped := c.AfterFunc(2500*time.Millisecond, func() { t.Error("a stopped timer fired") })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop must report true once, then false")
	}
	if c.Pending() != 4 {
		t.Fatalf("Pending = %d", c.Pending())
	}
	c.Advance(2 * time.Second)
	if want := []string{"a", "b1", "b2"}; !reflect.DeepEqual(fired, want) {
		t.Fatalf("fired %v, want %v", fired, want)
	}
	if at["a"] != time.Second || at["b2"] != 2*time.Second || c.Now() != start.Add(2*time.Second) {
		t.Fatalf("times: %v, now %v", at, c.Now())
	}
	c.Advance(time.Hour)
	if len(fired) != 4 || at["c"] != 3*time.Second || c.Pending() != 0 {
		t.Fatalf("fired %v at %v, pending %d", fired, at, c.Pending())
	}
}

func TestClockTimerScheduledByATimerFiresInTheSameAdvance(t *testing.T) {
	c := admissiontest.NewClock(time.Unix(0, 0))
	done := make(chan time.Time, 1)
	c.AfterFunc(time.Second, func() {
		c.AfterFunc(time.Second, func() { done <- c.Now() })
	})
	c.Advance(5 * time.Second)
	select {
	case got := <-done:
		if got != time.Unix(2, 0) {
			t.Fatalf("chained timer ran at %v", got)
		}
	default:
		t.Fatal("chained timer did not fire within the Advance")
	}
}

func TestClockNonPositiveDelayRunsAtOnce(t *testing.T) {
	c := admissiontest.NewClock(time.Unix(0, 0))
	done := make(chan struct{})
	if c.AfterFunc(0, func() { close(done) }).Stop() {
		t.Fatal("a timer that already ran stopped")
	}
	<-done
}
