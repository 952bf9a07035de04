// Package benchkit is what the programs under bench/ share: their common
// flags and the run's directory (flags.go, kit.go), building kvgate and
// running its simulators and gateways, and redis-server, as processes of
// their own on free loopback ports (process.go, kvgate.go, gateway.go,
// redis.go, port.go), driving them with kvgate loadtest and reading its
// report (load.go), reading a /metrics page or a gateway's /status
// (metrics.go, gateway.go), naming the machine (machine.go), and stating
// acceptance checks (check.go).
//
// A benchmark must fail loudly when a part it starts does not come up:
// a start returns an error naming the command and the end of its log,
// never a process that might be running. Every process it starts is
// stopped by its own handle (Stop, or Kill for a fault the benchmark
// injects) or by the run's StopAll, never by name.
package benchkit
