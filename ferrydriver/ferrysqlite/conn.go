package ferrysqlite

import (
	"context"
	"database/sql/driver"
	"errors"

	"modernc.org/sqlite"
)

// The write handle's connections are wrapped so that the driver learns of
// every commit made through them, after it happened: a feed waiting for
// events and callers of AwaitSettled are woken at once, with no polling.
// (SQLite's own commit hook runs before the commit is durable and visible,
// which is too early to wake a reader.)

type connector struct {
	dsn    string
	inner  *sqlite.Driver
	events *commitEvents
}

func (c *connector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.inner.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &notifyConn{inner: conn, events: c.events}, nil
}

func (c *connector) Driver() driver.Driver { return c.inner }

// innerConn is what modernc.org/sqlite's connections implement.
type innerConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

type notifyConn struct {
	inner  driver.Conn
	events *commitEvents
	inTx   bool
}

var errNotSupported = errors.New("ferrysqlite: the sqlite connection lacks a method database/sql needs")

func (c *notifyConn) full() (innerConn, error) {
	ic, ok := c.inner.(innerConn)
	if !ok {
		return nil, errNotSupported
	}
	return ic, nil
}

func (c *notifyConn) Prepare(query string) (driver.Stmt, error) { return c.inner.Prepare(query) }
func (c *notifyConn) Close() error                              { return c.inner.Close() }

func (c *notifyConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *notifyConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	ic, err := c.full()
	if err != nil {
		return nil, err
	}
	tx, err := ic.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.inTx = true
	return &notifyTx{inner: tx, conn: c}, nil
}

func (c *notifyConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	ic, err := c.full()
	if err != nil {
		return nil, err
	}
	return ic.PrepareContext(ctx, query)
}

func (c *notifyConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ic, err := c.full()
	if err != nil {
		return nil, err
	}
	res, err := ic.ExecContext(ctx, query, args)
	if err == nil && !c.inTx {
		c.events.committed() // an autocommit statement
	}
	return res, err
}

func (c *notifyConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	ic, err := c.full()
	if err != nil {
		return nil, err
	}
	return ic.QueryContext(ctx, query, args)
}

func (c *notifyConn) Ping(ctx context.Context) error {
	ic, err := c.full()
	if err != nil {
		return err
	}
	return ic.Ping(ctx)
}

func (c *notifyConn) ResetSession(ctx context.Context) error {
	ic, err := c.full()
	if err != nil {
		return err
	}
	return ic.ResetSession(ctx)
}

func (c *notifyConn) IsValid() bool {
	ic, err := c.full()
	return err == nil && ic.IsValid()
}

type notifyTx struct {
	inner driver.Tx
	conn  *notifyConn
}

func (t *notifyTx) Commit() error {
	t.conn.inTx = false
	err := t.inner.Commit()
	if err != nil {
		t.conn.events.rolledBack()
		return err
	}
	t.conn.events.committed()
	return nil
}

func (t *notifyTx) Rollback() error {
	t.conn.inTx = false
	t.conn.events.rolledBack()
	return t.inner.Rollback()
}
