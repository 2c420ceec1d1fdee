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
	// stmts caches prepared statements by query text: SQLite parses and
	// plans a statement each time it is prepared, which costs more than
	// running the small statements Ferry uses.
	stmts map[string]*cachedStmt
}

type cachedStmt struct {
	st   driver.Stmt
	busy bool // its rows are open
}

// maxCachedStmts bounds the cache of one connection.
const maxCachedStmts = 256

// stmt returns a prepared statement for query and a function to call when
// the caller is done with it (rows closed, exec returned).
func (c *notifyConn) stmt(ctx context.Context, query string) (driver.Stmt, func(), error) {
	if cs, ok := c.stmts[query]; ok && !cs.busy {
		cs.busy = true
		return cs.st, func() { cs.busy = false }, nil
	}
	ic, err := c.full()
	if err != nil {
		return nil, nil, err
	}
	st, err := ic.PrepareContext(ctx, query)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := c.stmts[query]; !ok && len(c.stmts) < maxCachedStmts {
		if c.stmts == nil {
			c.stmts = map[string]*cachedStmt{}
		}
		cs := &cachedStmt{st: st, busy: true}
		c.stmts[query] = cs
		return st, func() { cs.busy = false }, nil
	}
	// In use already (a query inside the loop over its own rows), or the
	// cache is full: a statement for this call only.
	return st, func() { _ = st.Close() }, nil
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
func (c *notifyConn) Close() error {
	for _, cs := range c.stmts {
		_ = cs.st.Close()
	}
	c.stmts = nil
	return c.inner.Close()
}

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
	// Notes left by a transaction of another handle on the file belong to
	// no transaction of this connection: drop them.
	c.events.rolledBack()
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
	st, done, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	res, err := st.(driver.StmtExecContext).ExecContext(ctx, args)
	done()
	if err == nil && !c.inTx {
		c.events.committed() // an autocommit statement
	}
	return res, err
}

func (c *notifyConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	st, done, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		done()
		return nil, err
	}
	rr := &releasingRows{Rows: rows, done: done}
	if !c.inTx {
		rr.committed = c.events.committed // an autocommit write (UPDATE ... RETURNING) commits when its rows end
	}
	return rr, nil
}

// releasingRows gives its statement back to the cache when closed.
type releasingRows struct {
	driver.Rows
	done      func()
	committed func()
}

func (r *releasingRows) Close() error {
	err := r.Rows.Close()
	if r.done != nil {
		r.done()
		r.done = nil
	}
	if r.committed != nil && err == nil {
		r.committed()
		r.committed = nil
	}
	return err
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
