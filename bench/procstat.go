package bench

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat. It is
// 100 on every mainstream Linux build (the kernel's ABI fixes it there).
const clockTicks = 100

// procStat is the part of /proc/<pid>/stat the bench reads.
type procStat struct {
	pid                          int
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime uint64 // clock ticks
}

func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	return parseProcStat(pid, b)
}

// parseProcStat parses "pid (comm) state ppid … utime stime cutime cstime …";
// comm may contain spaces and parentheses, so it ends at the last ')'.
func parseProcStat(pid int, b []byte) (procStat, bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 15 {
		return procStat{}, false
	}
	num := func(n int) uint64 {
		v, _ := strconv.ParseUint(f[n-3], 10, 64)
		return v
	}
	return procStat{
		pid:    pid,
		comm:   string(b[open+1 : end]),
		ppid:   int(num(4)),
		utime:  num(14),
		stime:  num(15),
		cutime: num(16),
		cstime: num(17),
	}, true
}

func ticks(t uint64) float64 { return float64(t) / clockTicks }

// processCPU returns the CPU seconds (user + system) a process has used.
func processCPU(pid int) float64 {
	s, ok := readProcStat(pid)
	if !ok {
		return 0
	}
	return ticks(s.utime + s.stime)
}

// peakRSS returns a process's VmHWM (peak resident set) in bytes.
func peakRSS(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				kb, _ := strconv.ParseInt(fs[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

func allProcs() []procStat {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, ok := readProcStat(pid); ok {
			out = append(out, s)
		}
	}
	return out
}

// cpuSnapshot is the cumulative CPU of the processes the bench accounts
// for, at one instant.
type cpuSnapshot struct {
	at       time.Time
	relay    float64 // the relay child
	postgres float64 // every PostgreSQL process, see postgresCPU
	nats     float64 // nats-server processes
	self     float64 // the driver process
	boxBusy  float64 // whole machine, non-idle CPU seconds
	pgFound  bool
	natsSeen bool
	// pgOurs is the CPU of each PostgreSQL process that serves the bench
	// (backends whose application_name starts with "ferrybench") or the
	// cluster as a whole (background processes: WAL writer, checkpointer,
	// autovacuum…), by pid.
	pgOurs map[int]float64
}

// takeSnapshot reads the counters. relayPID may be 0. ours lists the pids
// of the PostgreSQL processes counted as the bench's own (see
// benchBackends); nil skips that figure.
//
// PostgreSQL CPU is the sum, over each postmaster (a "postgres" process
// whose parent is not one), of its own utime+stime, its cutime+cstime (the
// CPU of children it has already reaped: backends that exited) and the
// utime+stime of its live children (backends, walwriter, checkpointer,
// autovacuum…). The difference of two such sums is the cluster's CPU over
// the interval even when backends come and go. It includes every client of
// the cluster, so other load on the same PostgreSQL would show up here.
func takeSnapshot(relayPID int, ours []int) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), pgOurs: map[int]float64{}}
	if relayPID > 0 {
		s.relay = processCPU(relayPID)
	}
	procs := allProcs()
	byPID := make(map[int]procStat, len(procs))
	for _, p := range procs {
		byPID[p.pid] = p
	}
	isPG := func(p procStat) bool { return p.comm == "postgres" || strings.HasPrefix(p.comm, "postgres:") }
	masters := map[int]bool{}
	for _, p := range procs {
		if isPG(p) {
			if parent, ok := byPID[p.ppid]; !ok || !isPG(parent) {
				masters[p.pid] = true
			}
		}
		if p.comm == "nats-server" {
			s.nats += ticks(p.utime + p.stime)
			s.natsSeen = true
		}
	}
	for _, p := range procs {
		switch {
		case masters[p.pid]:
			s.postgres += ticks(p.utime + p.stime + p.cutime + p.cstime)
			s.pgFound = true
		case masters[p.ppid]:
			s.postgres += ticks(p.utime + p.stime)
		}
	}
	for _, pid := range ours {
		if p, ok := byPID[pid]; ok {
			s.pgOurs[pid] = ticks(p.utime + p.stime)
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	s.boxBusy = boxBusySeconds()
	return s
}

// boxBusySeconds reads the machine's non-idle CPU time from /proc/stat.
func boxBusySeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy uint64
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		// user nice system idle iowait irq softirq steal (guest is in user)
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return ticks(busy)
}

// CPU is the CPU used over a phase's measured interval, in seconds.
type CPU struct {
	Relay float64 `json:"relay_s"`
	// Postgres is the CPU of the bench's backends and of the cluster's
	// background processes; PostgresAll of every PostgreSQL process,
	// including other clients' backends.
	Postgres    float64 `json:"postgres_s"`
	PostgresAll float64 `json:"postgres_all_s"`
	NATS        float64 `json:"nats_s"`
	Driver      float64 `json:"driver_s"`
	Box         float64 `json:"box_s"`
	Seconds     float64 `json:"wall_s"`
}

func cpuDelta(a, b cpuSnapshot) CPU {
	return CPU{
		Relay:       b.relay - a.relay,
		Postgres:    oursDelta(a.pgOurs, b.pgOurs),
		PostgresAll: b.postgres - a.postgres,
		NATS:        b.nats - a.nats,
		Driver:      b.self - a.self,
		Box:         b.boxBusy - a.boxBusy,
		Seconds:     b.at.Sub(a.at).Seconds(),
	}
}

// oursDelta sums, over the processes alive at the end, the CPU used since
// the start (all of it for processes that started in between).
func oursDelta(a, b map[int]float64) float64 {
	var d float64
	for pid, cpu := range b {
		d += cpu - a[pid]
	}
	return d
}
