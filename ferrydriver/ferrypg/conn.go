package ferrypg

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// feedSettings pin the plans of the feed's queries to index scans on its
// dedicated session. The planner's statistics are most wrong exactly when
// it matters: right after a bulk load or an outage, when a batch's id range
// covers a large backlog the planner believes is tiny, and a bitmap scan
// plus sort would read the whole range for every batch (O(backlog)).
// The session's application_name, "ferry feed <schema> <feed>", shows in
// pg_stat_activity.
//
// The feed's statements are prepared once and planned once: a custom plan
// per execution would cost more than executing them. None is compiled
// (jit off): a scan the settings disable still runs where there is no
// other (the one-row settings table, which arming the wake-ups updates),
// and its penalty cost passes jit_above_cost, which compiled that UPDATE
// at every execution: 60-130 ms a wake-up.
const feedSettings = `SELECT set_config('enable_bitmapscan', 'off', false), set_config('enable_seqscan', 'off', false),
	set_config('plan_cache_mode', 'force_generic_plan', false), set_config('jit', 'off', false),
	set_config('application_name', left($1, 63), false)`

// session is a connection dedicated to one feed: its queries run there and,
// when notifications are on, it LISTENs on the outbox channel.
type session struct {
	exec  executor
	wait  func(ctx context.Context) (string, error) // a notification's payload; nil: cannot listen
	close func()
}

type sessionFunc func(ctx context.Context) (*session, error)

func poolSession(pool *pgxpool.Pool) sessionFunc {
	return func(ctx context.Context) (*session, error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		// The session carries settings and maybe a LISTEN: never give it
		// back to the pool.
		conn := c.Hijack()
		return &session{
			exec: pgxExec{conn},
			wait: func(ctx context.Context) (string, error) {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					return "", err
				}
				return n.Payload, nil
			},
			close: func() { _ = conn.Close(context.Background()) },
		}, nil
	}
}

func sqlSession(db *sql.DB) sessionFunc {
	_, isPgx := db.Driver().(*stdlib.Driver)
	return func(ctx context.Context) (*session, error) {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		s := &session{
			exec: sqlExec{c},
			close: func() {
				// Make database/sql discard the connection instead of
				// pooling it with the feed's settings and LISTEN.
				_ = c.Raw(func(any) error { return driver.ErrBadConn })
				_ = c.Close()
			},
		}
		if isPgx {
			var pc *pgx.Conn
			_ = c.Raw(func(dc any) error {
				if sc, ok := dc.(*stdlib.Conn); ok {
					pc = sc.Conn()
				}
				return nil
			})
			if pc != nil {
				s.wait = func(ctx context.Context) (string, error) {
					n, err := pc.WaitForNotification(ctx)
					if err != nil {
						return "", err
					}
					return n.Payload, nil
				}
			}
		}
		return s, nil
	}
}

// openSession opens a feed session, applies feedSettings and, if listen,
// subscribes to the outbox channel.
func (d *Driver[TTx]) openSession(ctx context.Context, feed string, partition int, listen bool) (*session, error) {
	s, err := d.session(ctx)
	if err != nil {
		return nil, err
	}
	if err := d.checkSession(ctx, s, "the relay's feed"); err != nil {
		s.close()
		return nil, err
	}
	if _, err := s.exec.exec(ctx, feedSettings, "ferry feed "+d.cfg.Schema+" "+feed); err != nil {
		s.close()
		return nil, err
	}
	if !listen || s.wait == nil {
		s.wait = nil
		return s, nil
	}
	if _, err := s.exec.exec(ctx, "LISTEN "+pgx.Identifier{d.channel + "." + strconv.Itoa(partition)}.Sanitize()); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// checkSession fails, wrapping ferrydriver.ErrMisconfigured, when s is not
// one PostgreSQL session, as behind a transaction-pooling proxy (PgBouncer
// with pool_mode = transaction), which runs each transaction on whichever
// server connection is free and gives that connection to other clients in
// between. What needs a session (the feed's settings and LISTEN, the
// settlement listener's LISTEN) would then act on connections it does not
// hold: settings leak to other clients, notifications reach no one.
//
// The check reads the session's server process, another client's (the
// pool's), then the session's again. A real session keeps its server
// process, which no other client can have, so the check never fails on
// one. A transaction pooler hands the server connection the session just
// released to the next client (PgBouncer takes the most recently released
// one first), or runs the session's next statement on another: the check
// fails, unless a third client took and returned that connection in
// between. With pgx's default statement cache such a proxy already fails
// the first queries (SQLSTATE 26000 or 42P05: a cached prepared statement
// missing from, or already on, the server connection a message reached):
// also reported here.
func (d *Driver[TTx]) checkSession(ctx context.Context, s *session, what string) error {
	for range sessionChecks {
		var mine, theirs, again int32
		err := queryRow(ctx, s.exec, []any{&mine}, sqlBackendPID)
		if err == nil {
			err = queryRow(ctx, d.db, []any{&theirs}, sqlBackendPID)
		}
		if err == nil {
			err = queryRow(ctx, s.exec, []any{&again}, sqlBackendPID)
		}
		if code := pgErrCode(err); code == "26000" || code == "42P05" {
			return fmt.Errorf("ferrypg: %s needs a PostgreSQL session of its own: %w: %s (%v)", what, ferrydriver.ErrMisconfigured, noSessionAdvice, err)
		}
		if err != nil {
			return err
		}
		if theirs == mine || again != mine {
			return fmt.Errorf("ferrypg: %s needs a PostgreSQL session of its own: %w: its connection ran on server process %d, then on %d, and another client's on %d: %s",
				what, ferrydriver.ErrMisconfigured, mine, again, theirs, noSessionAdvice)
		}
	}
	return nil
}

// sessionChecks is how many times checkSession looks: behind a busy
// transaction pooler one look may miss (a third client took the released
// connection), three rarely all do.
const sessionChecks = 3

const sqlBackendPID = `SELECT pg_backend_pid()`

// noSessionAdvice is what to do when a component that needs a session has
// none.
const noSessionAdvice = "a transaction-pooling proxy (PgBouncer pool_mode = transaction) is between Ferry and PostgreSQL; " +
	"give the relay and AwaitSettled a direct or session-pooled URL (ferry relay/run: --database-url or FERRY_DATABASE_URL; " +
	"in Go: the pool passed to ferrypg.New), producers and consumers can stay behind the proxy with default_query_exec_mode=cache_describe in their URL"
