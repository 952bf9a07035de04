package benchkit

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"time"
)

// StartRedis starts the redis-server binary bin at addr ("" for a free
// loopback port), keeping nothing on disk, and waits until it accepts
// connections. Its URL is redis://addr/0, its log redis.log; restarting
// it at the same addr brings a store back where its clients expect it,
// empty.
func (k *Kit) StartRedis(ctx context.Context, bin, addr string) (*Process, error) {
	if addr == "" {
		a, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		addr = a
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := k.Exec(ctx, "redis", bin, "--port", port, "--bind", host,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", k.Dir)
	if err != nil {
		return nil, err
	}
	p.Addr, p.URL = addr, "redis://"+addr+"/0"
	listening := func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	if err := p.waitReady("redis-server", 30*time.Second, listening); err != nil {
		return nil, err
	}
	return p, nil
}

// RedisVersion is what the redis-server binary bin says of its version,
// for a benchmark's header; "" where it does not say.
func RedisVersion(bin string) string {
	out, _ := exec.Command(bin, "--version").Output()
	return strings.TrimSpace(string(out))
}
