// Package holeproxy is a TCP proxy that can blackhole what it forwards:
// connections stay open and new ones are accepted, but no byte passes
// either way until the hole is closed again, as a network partition does.
// Tests and benchmarks put it between a gateway and Redis to cut the link
// without stopping either side, which a stopped server or a closed socket
// cannot show.
package holeproxy
