// Package companies is Ferry's example of transactions that retry by the
// right rules and requests that are idempotent: linking a member to a
// company that may not exist yet, as in "two requests creating different
// companies still collide".
//
// LinkCompany finds or creates a company by its canonical business key
// (under a unique index), records the membership, keeps a per-company
// member counter, gives new companies a display number from a shared
// sequence, and emits a MembershipLinked event, all in one transaction run
// by ferry.RunTx:
//
//   - Two requests for different companies still meet on the shared
//     sequence row. Under REPEATABLE READ (PostgreSQL, as the tests run it)
//     the loser gets a serialization failure and RunTx runs the whole
//     callback again, with fresh reads: nothing of the failed attempt
//     survives, and display numbers have no gaps.
//   - Two requests for the same company meet on the unique business key:
//     under REPEATABLE READ the loser is aborted and its rerun finds the
//     company. Under READ COMMITTED its insert does nothing and it reads the
//     winner's company, but the sequence number it took commits unused: a
//     gap.
//   - On MySQL (InnoDB, REPEATABLE READ) a write never fails for a
//     concurrent update: it waits for the row and then reads its latest
//     version, so the sequence row alone would queue requests, not abort
//     them, and the loser of a race for one company would take a number
//     it cannot use. The business key is therefore read with FOR UPDATE:
//     for a company that does not exist yet, that locks the gap of the
//     unique index where it would go. Two requests for one company (or
//     for companies in one gap) then each wait for the other's insert, and
//     InnoDB rolls one back with a deadlock (1213), which RunTx runs again:
//     its rerun finds the company, and numbers have no gaps.
//   - A resent request (same request ID and input) returns the stored result
//     without running again; the same ID with another input is refused.
//   - The e-mail to the new member is not sent here: the event is, through
//     the outbox, and a consumer sends the e-mail once it committed.
//
// The same code runs on PostgreSQL (database/sql with the pgx driver), on
// MySQL and MariaDB (ferrymysql) and on SQLite.
package companies

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"unicode"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/google/uuid"
)

// Backend is a Ferry driver for *sql.Tx that can run transactions:
// ferrypg.NewSQL, ferrymysql.New or ferrysqlite.Open.
type Backend interface {
	ferrydriver.Driver[*sql.Tx]
	txdriver.Transactor[*sql.Tx]
}

// App is the company service.
type App struct {
	db      Backend
	client  *ferry.Client[*sql.Tx]
	dialect string // the backend's Name(): "postgres", "mysql" or "sqlite"
	log     *slog.Logger
	// ReserveNumbersFirst takes a new company's display number from the
	// sequence in a short transaction of its own, before the main one
	// (see ReserveDisplayNumber).
	ReserveNumbersFirst bool
	// exec runs statements outside a request (schema, sequence
	// reservations); on SQLite it is the driver's DB().
	exec *sql.DB
}

// New returns the service over db, whose statements it runs on handle
// (the *sql.DB the backend uses: ferrysqlite's DB(), or the database/sql
// handle given to ferrypg.NewSQL or ferrymysql.New).
func New(db Backend, handle *sql.DB, log *slog.Logger) (*App, error) {
	c, err := ferry.NewClient(db, nil)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &App{db: db, client: c, dialect: db.Name(), log: log, exec: handle}, nil
}

// q rewrites ? placeholders as $n for PostgreSQL.
func (a *App) q(s string) string {
	if a.dialect != "postgres" {
		return s
	}
	var b strings.Builder
	n := 0
	for _, r := range s {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// insertOrNothing is stmt, an INSERT, made to do nothing (and report no
// row) when it would duplicate the unique column conflict.
func (a *App) insertOrNothing(stmt, conflict string) string {
	if a.dialect == "mysql" {
		// MySQL has no conflict target: the update that changes nothing
		// applies to any unique key, which is why only inserts whose
		// other unique columns cannot collide use it here. (It reports
		// no row only without the DSN's clientFoundRows.)
		col, _, _ := strings.Cut(conflict, ",")
		return stmt + ` ON DUPLICATE KEY UPDATE ` + col + ` = ` + col
	}
	return stmt + ` ON CONFLICT (` + conflict + `) DO NOTHING`
}

// nextNumber takes the next display number in tx (or, when tx is nil, in a
// statement of its own on the handle).
func (a *App) nextNumber(ctx context.Context, tx *sql.Tx) (int64, error) {
	type execQuerier interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
	var q execQuerier = a.exec
	if tx != nil {
		q = tx
	}
	if a.dialect == "mysql" {
		// No UPDATE … RETURNING: LAST_INSERT_ID(expr) hands the new value
		// back in the statement's own reply.
		r, err := q.ExecContext(ctx, `UPDATE sequences SET value = LAST_INSERT_ID(value + 1) WHERE name = 'company_display_number'`)
		if err != nil {
			return 0, err
		}
		return r.LastInsertId()
	}
	var n int64
	err := q.QueryRowContext(ctx, a.q(`UPDATE sequences SET value = value + 1 WHERE name = 'company_display_number' RETURNING value`)).Scan(&n)
	return n, err
}

// Migrate creates the service's tables in the handle's default schema.
func (a *App) Migrate(ctx context.Context) error {
	big, text, id := "INTEGER", "TEXT", "TEXT"
	switch a.dialect {
	case "postgres":
		big = "BIGINT"
	case "mysql":
		// Keys need a length; utf8mb4's binary collation compares as
		// PostgreSQL and SQLite do.
		big, text, id = "BIGINT", "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", "CHAR(36)"
	}
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS companies (
			id             ` + id + ` PRIMARY KEY,
			canonical_key  ` + text + ` NOT NULL UNIQUE,
			name           ` + text + ` NOT NULL,
			display_number ` + big + ` NOT NULL UNIQUE,
			member_count   ` + big + ` NOT NULL DEFAULT 0)`,
		`CREATE TABLE IF NOT EXISTS memberships (
			company_id ` + id + ` NOT NULL,
			member_id  ` + text + ` NOT NULL,
			role       ` + text + ` NOT NULL,
			PRIMARY KEY (company_id, member_id))`,
		`CREATE TABLE IF NOT EXISTS sequences (name ` + text + ` PRIMARY KEY, value ` + big + ` NOT NULL)`,
		a.insertOrNothing(`INSERT INTO sequences (name, value) VALUES ('company_display_number', 0)`, "name"),
	} {
		if _, err := a.exec.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("companies: migrate: %w", err)
		}
	}
	return nil
}

// LinkInput is a request to make a member part of a company.
type LinkInput struct {
	CompanyName    string `json:"company_name"`
	BusinessNumber string `json:"business_number,omitempty"`
	MemberID       string `json:"member_id"`
	Role           string `json:"role"`
}

// LinkResult is what LinkCompany returns, and what a resend gets back.
type LinkResult struct {
	CompanyID         uuid.UUID `json:"company_id"`
	DisplayNumber     int64     `json:"display_number"`
	CompanyCreated    bool      `json:"company_created"`
	MembershipCreated bool      `json:"membership_created"`
	MemberCount       int64     `json:"member_count"`
	EventID           uuid.UUID `json:"event_id"`
}

// ErrInvalidInput is wrapped by errors about the request itself.
var ErrInvalidInput = errors.New("invalid input")

// CanonicalKey is the company's business key: its business number, digits
// only, when it has one; otherwise its name folded to lower case, without
// punctuation, spacing or a legal-form suffix. Two different companies that
// share a name and have no number would merge: require numbers where that
// matters.
func CanonicalKey(in LinkInput) (string, error) {
	if in.BusinessNumber != "" {
		var b strings.Builder
		for _, r := range in.BusinessNumber {
			if unicode.IsDigit(r) {
				b.WriteRune(r)
			}
		}
		if b.Len() < 5 {
			return "", fmt.Errorf("%w: business number %q has fewer than 5 digits", ErrInvalidInput, in.BusinessNumber)
		}
		return "bn:" + b.String(), nil
	}
	words := strings.FieldsFunc(strings.ToLower(in.CompanyName), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	for len(words) > 1 {
		switch words[len(words)-1] {
		case "inc", "incorporated", "ltd", "limited", "llc", "co", "corp", "corporation", "gmbh", "sa", "ag":
			words = words[:len(words)-1]
			continue
		}
		break
	}
	if len(words) == 0 {
		return "", fmt.Errorf("%w: company name %q has no letters or digits", ErrInvalidInput, in.CompanyName)
	}
	return "name:" + strings.Join(words, " "), nil
}

// ReserveDisplayNumber takes the next display number in a transaction of
// its own. Taking it before the request's transaction keeps the shared
// sequence row out of that transaction (no request waits on or conflicts
// over it for longer than one UPDATE) at the price of gaps: a number taken
// for a request that then fails, finds the company already exists, or is a
// resend answered from its stored result, is never used.
func (a *App) ReserveDisplayNumber(ctx context.Context) (int64, error) {
	return a.nextNumber(ctx, nil)
}

// LinkCompany links in.MemberID to the company in describes, creating the
// company if needed. requestID makes it idempotent: send the same ID again
// (after a timeout, say) and get the same result, with one effect.
func (a *App) LinkCompany(ctx context.Context, requestID string, in LinkInput) (LinkResult, error) {
	key, err := CanonicalKey(in)
	if err != nil {
		return LinkResult{}, err
	}
	if in.MemberID == "" {
		return LinkResult{}, fmt.Errorf("%w: member_id is empty", ErrInvalidInput)
	}
	var reserved int64
	if a.ReserveNumbersFirst {
		if reserved, err = a.ReserveDisplayNumber(ctx); err != nil {
			return LinkResult{}, err
		}
	}
	return ferry.RunTx(ctx, a.db, &ferry.TxOptions{RequestID: requestID, Input: in, Logger: a.log},
		func(ctx context.Context, tx *sql.Tx) (LinkResult, error) {
			var res LinkResult
			lock := ""
			if a.dialect == "mysql" {
				lock = " FOR UPDATE" // see the package doc
			}
			find := func() error {
				var id string
				err := tx.QueryRowContext(ctx, a.q(`SELECT id, display_number FROM companies WHERE canonical_key = ?`+lock), key).Scan(&id, &res.DisplayNumber)
				if err != nil {
					return err
				}
				res.CompanyID, err = uuid.Parse(id)
				return err
			}
			err := find()
			if errors.Is(err, sql.ErrNoRows) {
				number := reserved
				if number == 0 {
					// The shared row: every new company of every request
					// writes it, whatever its name.
					if number, err = a.nextNumber(ctx, tx); err != nil {
						return res, err
					}
				}
				// The same candidate ID on every attempt of this request.
				id := ferry.StableID(ctx, "company")
				r, err := tx.ExecContext(ctx, a.q(a.insertOrNothing(`INSERT INTO companies (id, canonical_key, name, display_number) VALUES (?, ?, ?, ?)`,
					"canonical_key")), id.String(), key, in.CompanyName, number)
				if err != nil {
					return res, err
				}
				if n, _ := r.RowsAffected(); n == 1 {
					res.CompanyID, res.DisplayNumber, res.CompanyCreated = id, number, true
				} else if err := find(); err != nil {
					// Another request created it first and committed.
					return res, err
				}
			} else if err != nil {
				return res, err
			}
			r, err := tx.ExecContext(ctx, a.q(a.insertOrNothing(`INSERT INTO memberships (company_id, member_id, role) VALUES (?, ?, ?)`,
				"company_id, member_id")), res.CompanyID.String(), in.MemberID, in.Role)
			if err != nil {
				return res, err
			}
			if n, _ := r.RowsAffected(); n == 1 {
				res.MembershipCreated = true
				if _, err := tx.ExecContext(ctx, a.q(`UPDATE companies SET member_count = member_count + 1 WHERE id = ?`), res.CompanyID.String()); err != nil {
					return res, err
				}
			}
			if err := tx.QueryRowContext(ctx, a.q(`SELECT member_count FROM companies WHERE id = ?`), res.CompanyID.String()).Scan(&res.MemberCount); err != nil {
				return res, err
			}
			if res.MembershipCreated {
				// Side effects go out as an event; a consumer acts on it
				// once this transaction committed.
				payload, err := json.Marshal(map[string]any{"company_id": res.CompanyID, "member_id": in.MemberID, "role": in.Role, "request_id": requestID})
				if err != nil {
					return res, err
				}
				ev := &ferry.Event{Topic: "companies", Key: res.CompanyID.String(), Type: "MembershipLinked", ContentType: "application/json", Payload: payload}
				if err := a.client.EmitTx(ctx, tx, ev); err != nil {
					return res, err
				}
				res.EventID = ev.ID
			}
			return res, nil
		})
}
