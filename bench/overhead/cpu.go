package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// On a machine whose cores the load generator, the backend and the proxy
// share, a proxy's throughput follows from the CPU it spends per request:
// what it takes, the others cannot use. With --<target>-pid, each cell
// also reads the CPU time (user + system) of that server's processes — the
// process and its descendants, such as nginx's workers — over its measured
// window, and the table gives it per request.

// userHZ is the unit of /proc's CPU times: USER_HZ, 100 on every Linux
// architecture Go supports.
const userHZ = 100

// treeCPU is the CPU time spent so far by pid and its descendants, read
// from the proc file system at root ("/proc").
func treeCPU(root string, pid int) (time.Duration, error) {
	stats, err := readStats(root)
	if err != nil {
		return 0, err
	}
	if _, ok := stats[pid]; !ok {
		return 0, fmt.Errorf("process %d: not running", pid)
	}
	children := map[int][]int{}
	for p, s := range stats {
		children[s.ppid] = append(children[s.ppid], p)
	}
	var ticks int64
	for todo := []int{pid}; len(todo) > 0; {
		p := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[p]...)
		ticks += stats[p].ticks
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

type procStat struct {
	ppid  int
	ticks int64 // utime + stime
}

// readStats reads every process's parent and CPU ticks. A process that
// ends while the directory is read is skipped.
func readStats(root string) (map[int]procStat, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", root, err)
	}
	stats := map[int]procStat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		s, err := parseStat(b)
		if err != nil {
			return nil, fmt.Errorf("%s/%d/stat: %w", root, pid, err)
		}
		stats[pid] = s
	}
	return stats, nil
}

// parseStat reads the parent (field 4) and utime + stime (fields 14 and
// 15) of a /proc/<pid>/stat line. The command (field 2) is in parentheses
// and may hold spaces and parentheses itself, so fields are counted from
// its last closing one.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("no command field in %q", b)
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("%d fields after the command, want at least 13", len(f))
	}
	num := func(k int) (int64, error) { return strconv.ParseInt(string(f[k-3]), 10, 64) }
	ppid, err1 := num(4)
	utime, err2 := num(14)
	stime, err3 := num(15)
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, fmt.Errorf("malformed stat line %q", b)
	}
	return procStat{ppid: int(ppid), ticks: utime + stime}, nil
}
