package gpuinfo

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
)

// procRoot is where ListenPorts reads processes and sockets.
const procRoot = "/proc"

// ListenPorts are the TCP ports pid or one of its ancestors listens on. A
// backend's memory is often held by a process that listens on nothing: vLLM
// runs its engine in a child of the API server, which owns the URL's port.
// Processes this host cannot see (another PID namespace, no permission)
// give nil.
func ListenPorts(pid int) []int {
	return listenPorts(procRoot, pid)
}

// Listening is the host's listening sockets, read once for a reading's
// processes.
type Listening map[string]int

// ReadListening reads the listening TCP sockets.
func ReadListening() Listening { return listeningInodes(procRoot) }

// Ports is ListenPorts against sockets read already.
func (l Listening) Ports(pid int) []int { return portsOf(procRoot, l, pid) }

func listenPorts(root string, pid int) []int {
	return portsOf(root, listeningInodes(root), pid)
}

func portsOf(root string, listening map[string]int, pid int) []int {
	if len(listening) == 0 {
		return nil
	}
	var ports []int
	for p, depth := pid, 0; p > 1 && depth < 16; depth++ {
		ents, err := os.ReadDir(root + "/" + strconv.Itoa(p) + "/fd")
		if err == nil {
			for _, e := range ents {
				link, err := os.Readlink(root + "/" + strconv.Itoa(p) + "/fd/" + e.Name())
				if err != nil {
					continue
				}
				inode, ok := strings.CutPrefix(link, "socket:[")
				if !ok {
					continue
				}
				if port, ok := listening[strings.TrimSuffix(inode, "]")]; ok && !slices.Contains(ports, port) {
					ports = append(ports, port)
				}
			}
		}
		p = parentPID(root, p)
	}
	slices.Sort(ports)
	return ports
}

// listeningInodes maps the inode of each listening TCP socket to its port.
func listeningInodes(root string) map[string]int {
	out := map[string]int{}
	for _, f := range []string{"/net/tcp", "/net/tcp6"} {
		fh, err := os.Open(root + f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" { // 0A: TCP_LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			port, err := strconv.ParseUint(hexPort, 16, 16)
			if err != nil {
				continue
			}
			out[fs[9]] = int(port)
		}
		fh.Close()
	}
	return out
}

// parentPID reads a process's parent from /proc/PID/stat; 0 when unknown.
func parentPID(root string, pid int) int {
	b, err := os.ReadFile(root + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fs[1])
	return ppid
}
