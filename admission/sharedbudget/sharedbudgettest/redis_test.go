package sharedbudgettest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admission/sharedbudget/sharedbudgettest"
)

// fatalRecorder catches a Fatalf instead of failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalRecorder) Skip(...any)          { f.msg = "skipped"; runtime.Goexit() }
func (f *fatalRecorder) Skipf(string, ...any) { f.msg = "skipped"; runtime.Goexit() }
func (f *fatalRecorder) SkipNow()             { f.msg = "skipped"; runtime.Goexit() }
func (f *fatalRecorder) Fatal(args ...any)    { f.msg = fmt.Sprint(args...); runtime.Goexit() }

// Without redis-server the tests fail, naming what to install; they never
// skip, so CI cannot pass without running them.
func TestStartRedisFailsLoudlyWithoutTheServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sharedbudgettest.StartRedis(rec)
		rec.msg = "returned"
	}()
	<-done
	if !strings.Contains(rec.msg, "redis-server is required") || !strings.Contains(rec.msg, "apt-get install redis-server") {
		t.Errorf("without redis-server: %q, want a failure that says to install it", rec.msg)
	}
}

func TestRedisStopsAndRestartsOnTheSamePort(t *testing.T) {
	srv := sharedbudgettest.StartRedis(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()
	srv.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping answered with the server stopped")
	}
	srv.Restart()
	if srv.Addr() != addr {
		t.Errorf("restarted on %s, want %s", srv.Addr(), addr)
	}
	if v, err := c.Exists(ctx, "k").Result(); err != nil || v != 0 {
		t.Errorf("after the restart: exists %d, %v; want an empty server", v, err)
	}
}
