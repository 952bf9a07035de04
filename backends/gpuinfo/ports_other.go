//go:build !linux

package gpuinfo

// ListenPorts needs Linux's /proc; elsewhere no process is told apart by
// its ports.
func ListenPorts(pid int) []int { return nil }

// Listening is the host's listening sockets: none known here.
type Listening map[string]int

// ReadListening reads nothing here.
func ReadListening() Listening { return nil }

// Ports knows no ports here.
func (l Listening) Ports(pid int) []int { return nil }
