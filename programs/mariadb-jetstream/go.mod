module github.com/ferry-dev/ferry/programs/mariadb-jetstream

go 1.26.0

require (
	github.com/ferry-dev/ferry v0.1.0
	github.com/ferry-dev/ferry/ferrydriver/ferrymysql v0.1.0
	github.com/ferry-dev/ferry/ferrysink/ferrynats v0.1.0
	github.com/nats-io/nats.go v1.56.0
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/go-mysql-org/go-mysql v1.13.0 // indirect
	github.com/go-sql-driver/mysql v1.9.3 // indirect
	github.com/goccy/go-json v0.10.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pingcap/errors v0.11.5-0.20250318082626-8f80e5cb09ec // indirect
	github.com/pingcap/log v1.1.1-0.20241212030209-7e3ff8601a2a // indirect
	github.com/pingcap/tidb/pkg/parser v0.0.0-20250421232622-526b2c79173d // indirect
	github.com/shopspring/decimal v1.2.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	gopkg.in/natefinch/lumberjack.v2 v2.2.1 // indirect
)
