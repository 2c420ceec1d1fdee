package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
)

// MachineInfo records where and with what a run was made.
type MachineInfo struct {
	CPUs       int               `json:"cpus"`
	GOMAXPROCS int               `json:"gomaxprocs"`
	CPUModel   string            `json:"cpu_model"`
	Memory     string            `json:"memory"`
	Kernel     string            `json:"kernel"`
	Go         string            `json:"go"`
	PostgreSQL string            `json:"postgresql"`
	PGSettings map[string]string `json:"pg_settings"`
	NATS       string            `json:"nats"`
	JetStream  string            `json:"jetstream"`
	Modules    map[string]string `json:"modules"`
	Producers  int               `json:"producers"`
	Keys       int               `json:"keys"`
	Payload    int               `json:"payload_bytes"`
}

var pgSettingNames = []string{"synchronous_commit", "fsync", "full_page_writes", "wal_level", "shared_buffers", "max_wal_size", "checkpoint_timeout", "max_connections", "autovacuum"}

func collectMachineInfo(ctx context.Context, pool *pgxpool.Pool, nc *nats.Conn, o *Options) *MachineInfo {
	m := &MachineInfo{
		CPUs:       runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go:         runtime.Version(),
		PGSettings: map[string]string{},
		Modules:    map[string]string{},
		Producers:  o.Producers,
		Keys:       o.Keys,
		Payload:    PayloadSize,
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(strings.TrimPrefix(line, "MemTotal:")); len(f) > 0 {
			if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
				m.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&m.PostgreSQL)
	for _, name := range pgSettingNames {
		var v string
		if pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v) == nil {
			m.PGSettings[name] = v
		}
	}
	m.NATS = nc.ConnectedServerVersion()
	m.JetStream = "file storage, one replica, default (lazy) fsync; stream per phase created by ferrynats (duplicate window 2 min)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			for _, want := range []string{"watermill", "riverqueue/river", "jackc/pgx", "nats-io/nats.go", "modernc.org/sqlite", "ferry-dev/ferry"} {
				if strings.Contains(d.Path, want) {
					v := d.Version
					if d.Replace != nil {
						v = "local " + d.Replace.Path
					}
					m.Modules[d.Path] = v
				}
			}
		}
	}
	return m
}
