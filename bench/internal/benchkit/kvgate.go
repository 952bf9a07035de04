package benchkit

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// Start starts kvgate with args, its output in logName.log, listening at
// addr, and waits until it answers /health (the simulator) or /readyz (the
// gateway, args[0] == "serve") with 200.
func (k *Kit) Start(ctx context.Context, logName, addr string, args ...string) (*Process, error) {
	p, err := k.Exec(ctx, logName, k.Bin, args...)
	if err != nil {
		return nil, err
	}
	p.Addr, p.URL = addr, "http://"+addr
	path := "/health"
	if args[0] == "serve" {
		path = "/readyz"
	}
	if err := p.waitReady("kvgate "+strings.Join(args, " "), time.Minute, func() bool { return answers(p.URL + path) }); err != nil {
		return nil, err
	}
	return p, nil
}

// answers says whether url answers a GET with 200.
func answers(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// StartSim starts kvgate sim with args on a free loopback port.
func (k *Kit) StartSim(ctx context.Context, logName string, args ...string) (*Process, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	return k.StartSimAt(ctx, logName, addr, args...)
}

// StartSimAt starts kvgate sim with args at addr: a simulator restarted
// where its gateway expects it.
func (k *Kit) StartSimAt(ctx context.Context, logName, addr string, args ...string) (*Process, error) {
	return k.Start(ctx, logName, addr, append([]string{"sim", "--listen", addr}, args...)...)
}
