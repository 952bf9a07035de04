package loadtest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestTargetReady(t *testing.T) {
	status := func(health, readyz int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/health":
				w.WriteHeader(health)
			case "/readyz":
				w.WriteHeader(readyz)
			}
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		name string
		url  string
		want bool
	}{
		{"vLLM healthy", status(200, 404), true},
		{"sim restarting after an OOM", status(503, 404), false},
		{"gateway without a healthy backend", status(404, 503), false},
		{"gateway ready", status(404, 200), true},
		{"no health endpoint at all", status(404, 404), true},
		{"not answering", closed.URL, false},
	} {
		if got := targetReady(context.Background(), http.DefaultClient, tc.url); got != tc.want {
			t.Errorf("%s: ready = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestWaitIdleWaitsForTheEngine(t *testing.T) {
	// Unhealthy (restarting) for three scrapes, then busy for two, then
	// idle: waitIdle returns on the sixth.
	calls := 0
	scrape := func(context.Context) (MetricsSample, error) {
		calls++
		s := MetricsSample{HasHealthy: true, Healthy: calls > 3, HasRunning: true, HasWaiting: true}
		if calls == 4 || calls == 5 {
			s.Running = 2
		}
		return s, nil
	}
	waitIdle(context.Background(), SystemClock{}, scrape, func(context.Context) bool { return true }, time.Minute)
	if calls != 6 {
		t.Errorf("returned after %d scrapes, want 6", calls)
	}
	// It gives up at its limit.
	calls = 0
	never := func(context.Context) (MetricsSample, error) {
		calls++
		return MetricsSample{HasHealthy: true, Healthy: false}, nil
	}
	clock := newManualClock()
	done := make(chan struct{})
	go func() {
		waitIdle(context.Background(), clock, never, func(context.Context) bool { return true }, time.Second)
		close(done)
	}()
	for {
		select {
		case <-done:
			if calls != 21 { // at 0, 50ms, …, 1s
				t.Errorf("%d scrapes before giving up, want 21", calls)
			}
			return
		default:
			if !clock.advanceIfWaiting() {
				time.Sleep(time.Millisecond)
			}
		}
	}
}
