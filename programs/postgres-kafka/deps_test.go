package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCompilesOnlyWhatItUses: the service's binary compiles no client of a
// database or broker it does not use (go list -deps: the packages built
// into it).
func TestCompilesOnlyWhatItUses(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for pkg := range strings.Lines(string(out)) {
		for _, not := range notCompiled {
			if strings.HasPrefix(strings.TrimSpace(pkg), not) {
				t.Errorf("the binary compiles %s (of %s), which it does not use", strings.TrimSpace(pkg), not)
			}
		}
	}
}

// notCompiled are the module paths of clients a PostgreSQL and Kafka
// service does not use.
var notCompiled = []string{
	"github.com/go-sql-driver/mysql",      // MySQL and MariaDB
	"github.com/go-mysql-org/go-mysql",    // the MariaDB binlog
	"go.mongodb.org/mongo-driver",         // MongoDB
	"modernc.org/sqlite",                  // SQLite
	"github.com/nats-io/nats.go",          // NATS
	"github.com/rabbitmq/amqp091-go",      // RabbitMQ
	"github.com/ethereum/go-ethereum",     // chain logs
	"github.com/prometheus/client_golang", // metrics
	"go.opentelemetry.io/otel/sdk",        // tracing
}
