// Package ferrypg is Ferry's PostgreSQL backend, for pgx v5 (New) and for
// database/sql with the pgx stdlib driver (NewSQL).
//
// # Schema
//
// Tables live in their own schema ("ferry" unless Config.Schema says
// otherwise), created by embedded, numbered, reversible migrations: run
// Driver.Migrate, `ferry migrate up`, or apply the output of
// `ferry migrate sql` with your own migration tool.
//
// # How the feed reads in commit order without skipping or stalling
//
// The outbox has a bigserial id and the writing transaction's xid. A plain
// "id > cursor" poll skips rows whose transaction drew its id early and
// committed late; reading only below the oldest running xid (the usual fix)
// stalls every event behind any long write transaction in the cluster.
// ferrypg instead reads in batches closed by database snapshots, as PgQ does:
// a batch is every row that became visible between two snapshots. Rows above
// the previous batch's highest id are read by a range scan of the primary
// key; rows below it can only come from transactions that were running at
// the previous snapshot, and are read by an index probe per such
// transaction. Both are O(batch). Per-key order comes from a
// transaction-scoped advisory lock per key, taken before the event's id is
// drawn: a key's next writer draws its id only once the previous one
// committed, so for one key, id order is commit order, and the feed returns
// every batch in id order. An emit writes the outbox row and nothing else:
// the relay numbers each key's events (Seq) as the feed returns them and
// saves the keys' last numbers with its checkpoint, in feed_seqs (the
// driver is a ferrydriver.KeySeqStore).
//
// # Partitions
//
// The outbox can be split by key hash (ferrydriver.PartitionOf) into
// partitions, one relay each. The count is stored with the schema
// (<schema>.settings, migration 004) and every producer statement is
// guarded by it: an append computed with another count writes nothing, so a
// key's events never land in two partitions. A driver with
// Config.Partitions 0 follows the stored count, also across a change; one
// with another value is refused (ferrydriver.ErrMisconfigured) once the
// stored count differs, as is a feed of a partition outside the count.
//
// Change the count with Driver.SetPartitions (`ferry partitions set N`): stop
// the producers, let the relays deliver everything (`ferry status` shows no
// lag), stop the relays, set the count, start the relays and then the
// producers. SetPartitions refuses while a relay holds a feed or a feed has
// not delivered every event of its partition, because a key whose partition
// changes must have nothing left undelivered in the old one; it holds
// producers back while it checks and changes the count (up to 5 s).
//
// Behind a transaction-pooling proxy (PgBouncer with pool_mode =
// transaction), producers, consumers and migrations work when the pool does
// not cache named prepared statements (pgx: default_query_exec_mode=
// cache_describe, exec or simple_protocol in the URL). The relay's feed and
// AwaitSettled need a session of their own (settings, LISTEN): they check
// that their connection keeps one server process and otherwise fail with
// ferrydriver.ErrMisconfigured, saying to give them a direct or
// session-pooled URL; the errors of pgx's statement cache behind such a
// proxy (SQLSTATE 26000, 42P05) wrap ErrMisconfigured too.
//
// Stability: the schema may change between minor versions before 1.0, always
// with a migration.
package ferrypg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// DefaultSchema is the schema Ferry's tables are created in.
const DefaultSchema = "ferry"

// Config configures a driver. The zero value is usable.
type Config struct {
	// Schema holds Ferry's tables. Default "ferry". Must be a plain
	// identifier (letters, digits, underscores).
	Schema string
	// Partitions is the number of outbox partitions: the outbox is split
	// by key hash so that several relays can share the work, one per
	// partition. The count is stored with the schema (migration 004 stores
	// this value, or 1) and changed only by SetPartitions.
	//
	// 0, the default, follows the stored count: producers load it and pick
	// up a change by themselves. Any other value is an assertion: a driver
	// whose count differs from the stored one refuses to append and to
	// open feeds, with an error wrapping ferrydriver.ErrMisconfigured,
	// rather than put a key's events into another partition than the
	// other producers (which would lose their order).
	Partitions int
	// DisableNotify stops producers from sending NOTIFY on append, and
	// relays from listening: they find new events by polling only. With
	// notifications on, producers notify only while a relay is idle, so a
	// busy system does not pay NOTIFY's commit-time lock.
	DisableNotify bool
	// TxIsolation is the isolation level of the transactions ferry.RunTx
	// runs: "" (the database's default, normally READ COMMITTED),
	// ReadCommitted, RepeatableRead or Serializable. Under the last two a
	// concurrent update makes PostgreSQL abort with a serialization
	// failure, and RunTx runs the callback again.
	TxIsolation Isolation
	// InboxIsolation is the isolation level of the transactions consumers
	// run handlers in (Driver.RunInTx): ReadCommitted (the default,
	// whatever the database's default_transaction_isolation),
	// RepeatableRead or Serializable. Under the last two, a handler whose
	// transaction conflicts with a concurrent one runs again at once.
	InboxIsolation Isolation
	// Logger receives warnings (a lost listener connection). Default: discard.
	Logger *slog.Logger
}

// Isolation is a transaction isolation level.
type Isolation string

// Isolation levels for Config.TxIsolation.
const (
	ReadCommitted  Isolation = "read committed"
	RepeatableRead Isolation = "repeatable read"
	Serializable   Isolation = "serializable"
)

func (i Isolation) sqlLevel() sql.IsolationLevel {
	switch i {
	case ReadCommitted:
		return sql.LevelReadCommitted
	case RepeatableRead:
		return sql.LevelRepeatableRead
	case Serializable:
		return sql.LevelSerializable
	}
	return sql.LevelDefault
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = DefaultSchema
	}
	if !identRE.MatchString(out.Schema) {
		return out, fmt.Errorf("ferrypg: Config.Schema %q is not a plain identifier: use letters, digits and underscores, starting with a letter", out.Schema)
	}
	if out.Partitions < 0 || out.Partitions > ferrydriver.MaxPartitions {
		return out, fmt.Errorf("ferrypg: Config.Partitions %d is out of range: use 1 to %d, or 0 to follow the count stored with the schema", out.Partitions, ferrydriver.MaxPartitions)
	}
	switch out.TxIsolation {
	case "", ReadCommitted, RepeatableRead, Serializable:
	default:
		return out, fmt.Errorf("ferrypg: Config.TxIsolation %q: use ferrypg.ReadCommitted, RepeatableRead or Serializable", out.TxIsolation)
	}
	switch out.InboxIsolation {
	case "":
		out.InboxIsolation = ReadCommitted
	case ReadCommitted, RepeatableRead, Serializable:
	default:
		return out, fmt.Errorf("ferrypg: Config.InboxIsolation %q: use ferrypg.ReadCommitted, RepeatableRead or Serializable", out.InboxIsolation)
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Driver is the PostgreSQL implementation of ferrydriver.Driver. TTx is
// pgx.Tx for drivers made by New and *sql.Tx for drivers made by NewSQL.
type Driver[TTx any] struct {
	cfg     Config
	db      executor
	begin   beginner
	session sessionFunc
	canWait bool // sessions can LISTEN
	wrapTx  func(TTx) executor
	beginTx func(ctx context.Context, iso Isolation) (TTx, func(context.Context) error, func(context.Context) error, error)
	queries queries
	park    parkQueries
	channel string
	hub     settleHub
	// stored is the partition count the driver last read from the schema;
	// 0 until it read one.
	stored atomic.Int64
	// maxConns reads the pool's size (0: unbounded).
	maxConns func() int
	// sessionsRC is 1 once the sessions' default isolation was seen to be
	// READ COMMITTED, 2 once seen to be another (see inRC).
	sessionsRC atomic.Int32
	// pool is the pgx pool of a driver made by New (nil for NewSQL): its
	// RunInTx runs lazyTx transactions.
	pool *pgxpool.Pool
}

// New returns a driver over a pgx pool. The pool stays the caller's: the
// driver never dials and never closes it.
func New(pool *pgxpool.Pool, cfg *Config) (*Driver[pgx.Tx], error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Driver[pgx.Tx]{
		pool:     pool,
		cfg:      c,
		db:       pgxExec{pool},
		begin:    poolBeginner{pool},
		session:  poolSession(pool),
		canWait:  true,
		wrapTx:   func(tx pgx.Tx) executor { return pgxExec{tx} },
		maxConns: func() int { return int(pool.Config().MaxConns) },
		beginTx: func(ctx context.Context, iso Isolation) (pgx.Tx, func(context.Context) error, func(context.Context) error, error) {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(iso)})
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, tx.Commit, tx.Rollback, nil
		},
	}
	d.init()
	return d, nil
}

// NewSQL returns a driver over a database/sql handle opened with the pgx
// stdlib driver ("pgx"). The handle stays the caller's. Wake-ups use
// LISTEN/NOTIFY when the handle's connections are pgx connections, and
// polling otherwise.
func NewSQL(db *sql.DB, cfg *Config) (*Driver[*sql.Tx], error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Driver[*sql.Tx]{
		cfg:      c,
		db:       sqlExec{db},
		begin:    sqlBeginner{db},
		session:  sqlSession(db),
		canWait:  isPgxDB(db),
		wrapTx:   func(tx *sql.Tx) executor { return sqlExec{tx} },
		maxConns: func() int { return db.Stats().MaxOpenConnections },
		beginTx: func(ctx context.Context, iso Isolation) (*sql.Tx, func(context.Context) error, func(context.Context) error, error) {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso.sqlLevel()})
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, func(context.Context) error { return tx.Commit() }, func(context.Context) error { return tx.Rollback() }, nil
		},
	}
	d.init()
	return d, nil
}

// MaxConns implements ferrydriver.Inbox: the pool's size (pgxpool's
// MaxConns; database/sql's MaxOpenConns, 0 when unbounded).
func (d *Driver[TTx]) MaxConns() int { return d.maxConns() }

func (d *Driver[TTx]) init() {
	d.queries = newQueries(d.cfg.Schema)
	d.park = newParkQueries(d.cfg.Schema)
	d.channel = d.cfg.Schema + ".outbox"
	d.hub.d = hubDriver[TTx]{d}
}

func isPgxDB(db *sql.DB) bool {
	_, ok := db.Driver().(*stdlib.Driver)
	return ok
}

// Schema returns the schema the driver's tables live in.
func (d *Driver[TTx]) Schema() string { return d.cfg.Schema }

// Partitions returns Config.Partitions: the partition count the driver
// asserts, or 0 when it follows the count stored with the schema (see
// StoredPartitions).
func (d *Driver[TTx]) Partitions() int { return d.cfg.Partitions }

// Name implements ferrydriver.Store.
func (d *Driver[TTx]) Name() string { return "postgres" }

// Capabilities implements ferrydriver.Store.
func (d *Driver[TTx]) Capabilities() ferrydriver.Capabilities {
	return ferrydriver.Capabilities{
		NotifyWakeups:     d.canWait && !d.cfg.DisableNotify,
		ConcurrentWriters: true,
	}
}

// PartitionOf returns the outbox partition Append writes key to
// (ferrydriver.PartitionOf): by Config.Partitions, or, when that is 0, by
// the stored count as the driver last read it (1 before it read one).
func (d *Driver[TTx]) PartitionOf(key string) int {
	return ferrydriver.PartitionOf(key, d.writeCount())
}

// writeCount is the partition count appends compute partitions with.
func (d *Driver[TTx]) writeCount() int {
	if d.cfg.Partitions > 0 {
		return d.cfg.Partitions
	}
	if n := d.stored.Load(); n > 0 {
		return int(n)
	}
	return 1 // a guess, which the first append's guard corrects
}

// AppendTx implements ferrydriver.Driver: the events are written in tx and
// share its fate.
func (d *Driver[TTx]) AppendTx(ctx context.Context, tx TTx, events []*ferryevent.Event) error {
	return d.append(ctx, d.wrapTx(tx), events)
}

// Append implements ferrydriver.Store.
func (d *Driver[TTx]) Append(ctx context.Context, events []*ferryevent.Event) error {
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin append: %w", err)
	}
	if err := d.append(ctx, e, events); err != nil {
		_ = rollback(ctx)
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit append: %w", err)
	}
	return nil
}

func (d *Driver[TTx]) append(ctx context.Context, e executor, events []*ferryevent.Event) error {
	n := len(events)
	if n == 0 {
		return nil
	}
	a, err := encodeEvents(events)
	if err != nil {
		return err
	}
	q, qNotify := d.queries.append, d.queries.appendNotify
	if n == 1 {
		q, qNotify = d.queries.appendOne, d.queries.appendOneNotify
	}
	if !d.cfg.DisableNotify {
		q = qNotify
	}
	parts := make([]int32, n)
	// The statement writes only if the schema's stored partition count is
	// the one the partitions were computed with (see sqlAppend). When it
	// wrote nothing, the stored count is read: a driver that follows the
	// schema computes the partitions again with it and runs the statement
	// again, in the same transaction, which a statement that wrote nothing
	// left intact.
	for attempt := 0; ; attempt++ {
		count := d.writeCount()
		for i, ev := range events {
			parts[i] = int32(ferrydriver.PartitionOf(ev.Key, count))
		}
		args := []any{a.ids, a.topics, a.keys, a.types, a.sources, a.contentTypes, a.headers, a.payloads, a.created, parts}
		if n == 1 {
			args = []any{a.ids[0], a.topics[0], a.keys[0], a.types[0], a.sources[0], a.contentTypes[0], a.headers[0], a.payloads[0], a.created[0], parts[0]}
		}
		args = append(args, count)
		if !d.cfg.DisableNotify {
			args = append(args, d.channel)
		}
		written, err := e.exec(ctx, q, args...)
		if err != nil {
			return d.wrapErr("append events to outbox", err)
		}
		if written == int64(n) {
			return nil
		}
		if written != 0 {
			return fmt.Errorf("ferrypg: append events to outbox: %d of %d events written", written, n)
		}
		var stored *int32
		if err := queryRow(ctx, e, []any{&stored}, d.queries.storedPartitions); err != nil && !isNoRows(err) {
			return d.wrapErr("append events to outbox: read the stored partition count", err)
		}
		switch {
		case stored != nil && int(*stored) == count:
			// The count was changed and changed back since the statement's
			// snapshot: write again.
		case stored != nil && d.cfg.Partitions > 0:
			return d.mismatch("append events to outbox", int(*stored))
		case stored != nil:
			d.stored.Store(int64(*stored))
		}
		// No settings row was visible, or the count changed: a READ
		// COMMITTED transaction sees the new row in its next statement.
		if attempt == 2 {
			if stored == nil {
				return &partitionsChangedError{schema: d.cfg.Schema}
			}
			return fmt.Errorf("ferrypg: append events to outbox: the stored partition count of schema %q keeps changing (now %d); run the transaction again", d.cfg.Schema, *stored)
		}
	}
}

// mismatch is the error for a Config.Partitions that differs from the
// stored count.
func (d *Driver[TTx]) mismatch(op string, stored int) error {
	return d.countStore().Mismatch(op, d.cfg.Partitions, stored)
}

// countStore names the schema in partition-count errors.
func (d *Driver[TTx]) countStore() driverkit.CountStore {
	return driverkit.CountStore{Driver: "ferrypg", Kind: "schema", Name: strconv.Quote(d.cfg.Schema)}
}

// partitionsChangedError: the transaction's snapshot shows no settings
// row, because the partition count was changed after the snapshot was
// taken (REPEATABLE READ or SERIALIZABLE). Nothing was written; the
// transaction must run again, and ClassifyTxError says so.
type partitionsChangedError struct{ schema string }

func (e *partitionsChangedError) Error() string {
	return fmt.Sprintf("ferrypg: append events to outbox: the partition count of schema %q was changed while this transaction ran "+
		"(its snapshot shows no stored count); nothing was written: run the transaction again. If this persists, the row of %s.settings is missing: "+
		"restore it with `ferry partitions set N --force`", e.schema, e.schema)
}

// wrapErr describes err, turning "relation does not exist" into a hint.
func (d *Driver[TTx]) wrapErr(op string, err error) error {
	switch pgErrCode(err) {
	case "42P01", "3F000": // undefined_table, invalid_schema_name
		if strings.Contains(err.Error(), "settings") {
			return fmt.Errorf("ferrypg: %s: %w: schema %q has no stored partition count (migration 004); apply it with `ferry migrate up --schema %s` or Driver.Migrate (%v)",
				op, ferrydriver.ErrSchemaMissing, d.cfg.Schema, d.cfg.Schema, err)
		}
		return fmt.Errorf("ferrypg: %s: %w: schema %q has no Ferry tables; create them with `ferry migrate up --schema %s` or Driver.Migrate (%v)",
			op, ferrydriver.ErrSchemaMissing, d.cfg.Schema, d.cfg.Schema, err)
	case "26000", "42P05": // prepared statement does not exist, already exists
		if strings.Contains(err.Error(), "prepared statement") {
			return fmt.Errorf("ferrypg: %s: %w: %s (%v)", op, ferrydriver.ErrMisconfigured, statementCacheAdvice, err)
		}
	}
	return fmt.Errorf("ferrypg: %s: %w", op, err)
}

// statementCacheAdvice explains SQLSTATE 26000 and 42P05 on pgx's cached
// statements ("stmtcache_…"): they live on one server connection, and the
// connection's next transaction reached another.
const statementCacheAdvice = "pgx's statement cache needs every transaction of a connection on one PostgreSQL session, " +
	"and a transaction-pooling proxy (PgBouncer pool_mode = transaction) is between Ferry and PostgreSQL: " +
	"add default_query_exec_mode=cache_describe (or exec, or simple_protocol) to this pool's URL, or give it a direct or session-pooled URL " +
	"(the relay and AwaitSettled need one anyway)"

type queries struct {
	append, appendNotify, tickRead, readBatch                                                                    string
	appendOne, appendOneNotify                                                                                   string
	loadCheckpoint, saveCheckpoint, saveCheckpointSeqs, loadKeySeqs                                              string
	acquireLease, renewLease, releaseLease, getLease                                                             string
	insertDeadLetters, countDeadLetter                                                                           string
	listDeadLetters, getDeadLetter, countMatchingDeadLetters, deadLetterReasons                                  byFeed
	deleteDelivered, feedLag, armListener, disarmListener, seqCache                                              string
	partitionCursors, feedLagExact, countDeadLetterExact                                                         string
	deleteDeadLetters, pruneKeySeqs                                                                              string
	selectRedrive, deleteDeadLetterRefs, redriveToParked                                                         string
	inboxInsertClaim, inboxInsert, inboxClaim, inboxRescueKeys, inboxCharge, inboxHead, inboxClaimOne, inboxKill string
	inboxUnclaim, inboxRescueDue, inboxFinishRows, inboxLockKeys, inboxRefreshKeys, inboxGroups                  string
	inboxListProcessing, inboxRetractClaims, inboxCompleteOne                                                    string
	inboxClaimHolders, inboxExpireClaims                                                                         string
	inboxFinishRowsCommit, inboxCompleteOneCommit, inboxLostClaims                                               string
	inboxCompleteRows, inboxCompleteRowsCommit                                                                   string
	activityInsert, activityList                                                                                 string
	inboxDeadReasons                                                                                             string
	inboxSetState, inboxList, inboxStates, inboxDeleteProcessed, inboxAttempts                                   string
	waiterAdd, waiterRemove, inboxCounts                                                                         string
	inboxNotify, inboxSetPolicy, inboxSweepFirst, inboxSweepNext, inboxSweepProgress                             string
	inboxDeleteIdleKeys, inboxRetract, oldestOutboxTx                                                            string
	requestClaim, requestFinish, requestGet, requestDelete                                                       string
	storedPartitions, lockSettings, truncateSettings, insertSettings                                             string
	liveLeases, allCheckpoints, highestPartition, partitionHasEvents                                             string
	undelivered, parkedByFeed, listFeeds                                                                         string
	outboxEvents                                                                                                 string
}

func newQueries(schema string) queries {
	s := pgx.Identifier{schema}.Sanitize()
	r := func(q string) string { return strings.ReplaceAll(q, "{schema}", s) }
	return queries{
		outboxEvents: r(sqlOutboxEvents),
		append:       r(sqlAppend), appendNotify: r(sqlAppendNotify), appendOne: r(sqlAppendOne), appendOneNotify: r(sqlAppendOneNotify), tickRead: r(sqlTickRead), readBatch: r(sqlReadBatch),
		loadCheckpoint: r(sqlLoadCheckpoint), saveCheckpoint: r(sqlSaveCheckpoint),
		saveCheckpointSeqs: r(sqlSaveCheckpointSeqs), loadKeySeqs: r(sqlLoadKeySeqs),
		acquireLease: r(sqlAcquireLease), renewLease: r(sqlRenewLease), releaseLease: r(sqlReleaseLease), getLease: r(sqlGetLease),
		insertDeadLetters: r(sqlInsertDeadLetters), listDeadLetters: feedQueries(r(sqlListDeadLetters)), getDeadLetter: feedQueries(r(sqlGetDeadLetter)),
		countDeadLetter: r(sqlCountDeadLetters),
		deleteDelivered: r(sqlDeleteDelivered), feedLag: r(sqlFeedLag), armListener: r(sqlArmListener), disarmListener: r(sqlDisarmListener), seqCache: r(sqlSeqCache),
		partitionCursors: r(sqlPartitionCursors), feedLagExact: r(sqlFeedLagExact), countDeadLetterExact: r(sqlCountDeadLettersExact),
		deleteDeadLetters: r(sqlDeleteDeadLetters), pruneKeySeqs: r(sqlPruneKeySeqs),
		selectRedrive: r(sqlSelectRedrive), deleteDeadLetterRefs: r(sqlDeleteDeadLetterRefs), redriveToParked: r(sqlRedriveToParked), countMatchingDeadLetters: feedQueries(r(sqlCountMatchingDeadLetters)),
		inboxInsertClaim: r(sqlInboxInsertClaim), inboxInsert: r(sqlInboxInsert), inboxClaim: r(sqlInboxClaim), inboxRescueKeys: r(sqlInboxRescueKeys),
		inboxCharge: r(sqlInboxCharge), inboxHead: r(sqlInboxHead), inboxClaimOne: r(sqlInboxClaimOne), inboxKill: r(sqlInboxKill),
		inboxClaimHolders: r(sqlInboxClaimHolders), inboxExpireClaims: r(sqlInboxExpireClaims),
		inboxUnclaim: r(sqlInboxUnclaim), inboxRescueDue: r(sqlInboxRescueDue), inboxFinishRows: r(strings.Replace(sqlInboxFinishRows, "{tail}", finishTail, 1)),
		inboxFinishRowsCommit:  r(strings.Replace(sqlInboxFinishRows, "{tail}", finishRowsTailCommit, 1)),
		inboxCompleteOneCommit: r(strings.Replace(sqlInboxCompleteOne, "{tail}", completeOneTailCommit, 1)), inboxLostClaims: r(sqlInboxLostClaims),
		activityInsert: r(sqlActivityInsert), activityList: r(sqlActivityList),
		deadLetterReasons: feedQueries(r(sqlDeadLetterReasons)), inboxDeadReasons: r(sqlInboxDeadReasons),
		inboxCompleteRows:       r(strings.Replace(sqlInboxCompleteRows, "{tail}", finishTail, 1)),
		inboxCompleteRowsCommit: r(strings.Replace(sqlInboxCompleteRows, "{tail}", finishRowsTailCommit, 1)),
		inboxLockKeys:           r(sqlInboxLockKeys), inboxRefreshKeys: r(sqlInboxRefreshKeys), inboxGroups: r(sqlInboxGroups),
		inboxListProcessing: r(inboxListProcessing), inboxRetractClaims: r(sqlInboxRetractClaims), inboxCompleteOne: r(strings.Replace(sqlInboxCompleteOne, "{tail}", finishTail, 1)),
		inboxSetState: r(sqlInboxSetState), inboxAttempts: r(sqlInboxAttempts), inboxList: r(sqlInboxList), inboxStates: r(sqlInboxStates), oldestOutboxTx: r(sqlOldestOutboxTx),
		inboxDeleteProcessed: r(sqlInboxDeleteProcessed), waiterAdd: r(sqlWaiterAdd), waiterRemove: r(sqlWaiterRemove), inboxCounts: r(sqlInboxCounts),
		inboxNotify: r(sqlInboxNotify), inboxSetPolicy: r(sqlInboxSetPolicy),
		inboxSweepFirst: r(sqlInboxSweepFirst), inboxSweepNext: r(sqlInboxSweepNext), inboxSweepProgress: r(sqlInboxSweepProgress),
		inboxDeleteIdleKeys: r(sqlInboxDeleteIdleKeys), inboxRetract: r(sqlInboxRetract),
		requestClaim:  r(sqlRequestClaim),
		requestFinish: r(sqlRequestFinish),
		requestGet:    r(sqlRequestGet),
		requestDelete: r(sqlRequestDelete),
		// The partition count (partitions.go).
		storedPartitions: r(sqlStoredPartitions), lockSettings: r(sqlLockSettings),
		truncateSettings: r(sqlTruncateSettings), insertSettings: r(sqlInsertSettings),
		liveLeases: r(sqlLiveLeases), allCheckpoints: r(sqlAllCheckpoints),
		highestPartition: r(sqlHighestPartition), partitionHasEvents: r(sqlPartitionHasEvents),
		undelivered: r(sqlUndelivered), parkedByFeed: r(sqlParkedByFeed), listFeeds: r(sqlListFeeds),
	}
}

// byFeed is a statement on dead letters in its two forms: of a partition
// (or of every feed), and of the partitions of a feed (see
// deadLetterFilter).
type byFeed struct{ exact, family string }

func feedQueries(q string) byFeed {
	return byFeed{exact: strings.ReplaceAll(q, "{feed}", exactFeed), family: strings.ReplaceAll(q, "{feed}", familyFeed)}
}

// of returns the statement for a feed filter (ListDeadLettersParams.Feed)
// and its $1.
func (b byFeed) of(filter string) (q, feed string) {
	exact, family := driverkit.FeedFilter(filter)
	if family != "" {
		return b.family, family
	}
	return b.exact, exact
}

var _ ferrydriver.Driver[pgx.Tx] = (*Driver[pgx.Tx])(nil)
var _ ferrydriver.Driver[*sql.Tx] = (*Driver[*sql.Tx])(nil)
var _ ferrydriver.Inbox[*sql.Tx] = (*Driver[*sql.Tx])(nil)

// isNoRows reports whether err means an empty result.
func isNoRows(err error) bool {
	return errors.Is(err, errNoRows) || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}
