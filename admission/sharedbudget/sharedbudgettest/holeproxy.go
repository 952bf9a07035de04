package sharedbudgettest

import (
	"testing"

	"github.com/kvgate/kvgate/internal/holeproxy"
)

// HoleProxy forwards TCP to a server until its hole is opened; from then on
// nothing passes either way and nothing is closed, as a network that
// blackholes the link.
type HoleProxy struct{ p *holeproxy.Proxy }

// StartHoleProxy listens on a loopback port and forwards to target (a
// host:port) until the test ends.
func StartHoleProxy(t testing.TB, target string) *HoleProxy {
	t.Helper()
	p, err := holeproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &HoleProxy{p}
}

// Addr is the proxy's host:port.
func (p *HoleProxy) Addr() string { return p.p.Addr }

// Cut opens the hole: from now on nothing passes either way, and nothing
// is closed.
func (p *HoleProxy) Cut() { p.p.Blackhole(true) }
