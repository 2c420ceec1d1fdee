package ferrypg

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strconv"

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
// per execution would cost more than executing them.
const feedSettings = `SELECT set_config('enable_bitmapscan', 'off', false), set_config('enable_seqscan', 'off', false),
	set_config('plan_cache_mode', 'force_generic_plan', false), set_config('application_name', left($1, 63), false)`

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
