package main

import (
	"io"
	"net"
	"sync"
)

// cutProxy stands between one replica and redis-server, so that the bench
// can cut that replica off from Redis while the others still reach it (a
// partition): cut closes its connections and refuses new ones until heal.
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex // guards below
	cut   bool
	conns map[net.Conn]struct{}
}

func newCutProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.relay(c)
	}
}

// track registers c unless the proxy is cut; false: c was closed.
func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *cutProxy) relay(c net.Conn) {
	if !p.track(c) {
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(up) {
		c.Close()
		return
	}
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

func (p *cutProxy) close() { p.ln.Close(); p.setCut(true) }
