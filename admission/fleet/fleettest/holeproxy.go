package fleettest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// HoleProxy forwards TCP to a server until its hole is opened; from then on
// it reads what either side sends and drops it, as a network that
// blackholes the link without closing it.
type HoleProxy struct {
	ln   net.Listener
	hole atomic.Bool
	wg   sync.WaitGroup
	mu   sync.Mutex // guards open
	open []net.Conn
}

// StartHoleProxy listens on a loopback port and forwards to target (a
// host:port) until the test ends.
func StartHoleProxy(t testing.TB, target string) *HoleProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &HoleProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.open = append(p.open, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(s, c)
			go p.pipe(c, s)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.open {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *HoleProxy) Addr() string { return p.ln.Addr().String() }

// Cut opens the hole: from now on nothing passes either way, and nothing
// is closed.
func (p *HoleProxy) Cut() { p.hole.Store(true) }

func (p *HoleProxy) pipe(dst io.Writer, src io.Reader) {
	defer p.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.hole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
