// Package benchkit is what the programs under bench/ share: building
// kvgate, running its simulators and gateways as processes of their own on
// free loopback ports, driving them with kvgate loadtest and reading its
// report, scraping a /metrics page, and stating acceptance checks.
//
// A benchmark must fail loudly when a part it starts does not come up:
// Start returns an error naming the command and its log, never a process
// that might be running. Every process it starts is stopped by its own
// handle (Stop, or Kill for a fault the benchmark injects), never by name.
package benchkit
