package holeproxy

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy is a TCP proxy on a free loopback port to one target, for a test
// or a benchmark that cuts a process off from another (a gateway replica
// from Redis) without stopping either: Blackhole(true) is a partition.
type Proxy struct {
	Addr   string // where it listens
	target string
	ln     net.Listener

	mu     sync.Mutex
	open   chan struct{} // closed while bytes flow; replaced by Blackhole(true)
	conns  map[net.Conn]struct{}
	closed chan struct{}
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to
// target, both ways.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, open: open, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Blackhole on keeps every connection open and still accepts new ones,
// but forwards no byte either way, as a partitioned network does; off lets
// what was held back through, in order, as TCP delivers it once a
// partition heals. A connection accepted while on reaches the target only
// when it is off.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		if on {
			p.open = make(chan struct{})
		}
	default:
		if !on {
			close(p.open)
		}
	}
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return nil
	default:
	}
	close(p.closed)
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// pass waits until bytes may flow; false once the proxy is closed.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
		return true
	case <-p.closed:
		return false
	}
}

// track keeps c for Close; false if the proxy is already closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
		p.conns[c] = struct{}{}
		return true
	}
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve forwards one connection: it dials the target only once bytes may
// flow, so that a connection made during a blackhole is accepted and then
// silent.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	if !p.pass() {
		return
	}
	t, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(t) {
		return
	}
	defer p.untrack(t)
	done := make(chan struct{}, 2)
	go func() { p.pump(t, c); done <- struct{}{} }()
	go func() { p.pump(c, t); done <- struct{}{} }()
	<-done
	<-done
}

// pump copies src to dst, holding what it read while the proxy is
// blackholed, and passes on src's end (a half-close) once it may.
func (p *Proxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite()
				return
			}
			dst.Close()
			return
		}
	}
}
