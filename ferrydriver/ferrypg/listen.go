package ferrypg

import (
	"context"
	"database/sql"
	"errors"

	"database/sql/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// listener waits for NOTIFY on one channel over a dedicated connection.
type listener interface {
	wait(ctx context.Context) error
	close()
}

type listenFunc func(ctx context.Context, channel string) (listener, error)

type pgxListener struct {
	conn    *pgx.Conn
	release func()
}

func (l *pgxListener) wait(ctx context.Context) error {
	_, err := l.conn.WaitForNotification(ctx)
	return err
}

func (l *pgxListener) close() { l.release() }

func listenOn(ctx context.Context, conn *pgx.Conn, channel string) error {
	_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}

func poolListener(pool *pgxpool.Pool) listenFunc {
	return func(ctx context.Context, channel string) (listener, error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		if err := listenOn(ctx, c.Conn(), channel); err != nil {
			c.Release()
			return nil, err
		}
		return &pgxListener{conn: c.Conn(), release: func() {
			// The connection has a LISTEN registered and may hold queued
			// notifications: do not hand it back to the pool.
			_ = c.Hijack().Close(context.Background())
		}}, nil
	}
}

var errNotPgx = errors.New("database/sql handle does not use the pgx driver")

func sqlListener(db *sql.DB) listenFunc {
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil
	}
	return func(ctx context.Context, channel string) (listener, error) {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		var pc *pgx.Conn
		_ = c.Raw(func(dc any) error {
			if sc, ok := dc.(*stdlib.Conn); ok {
				pc = sc.Conn()
			}
			return nil
		})
		if pc == nil {
			_ = c.Close()
			return nil, errNotPgx
		}
		if err := listenOn(ctx, pc, channel); err != nil {
			_ = c.Close()
			return nil, err
		}
		return &pgxListener{conn: pc, release: func() {
			_ = c.Raw(func(any) error { return driverBadConn })
			_ = c.Close()
		}}, nil
	}
}

// driverBadConn makes database/sql discard the connection instead of
// returning it, LISTEN still registered, to the pool.
var driverBadConn = errBadConn{}

type errBadConn struct{}

func (errBadConn) Error() string        { return "discard listening connection" }
func (errBadConn) Is(target error) bool { return target == driverErrBadConn }

var driverErrBadConn = driver.ErrBadConn
