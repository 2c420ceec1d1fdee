package ferrymysql

import (
	"database/sql"
	"fmt"

	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// An outbox row reaches the feed two ways: as a row image in the binlog
// (outboxColumns) or as a row of a SELECT (scanRow: a recovery scan, the
// rows of a committed XA transaction). Both give an outboxRow.
type outboxRow struct {
	ev       *ferryevent.Event
	invalid  string // set: the row is not a valid event, and why
	id       int64  // the row's id in ferry_outbox
	appended int64  // appended_at, µs
}

// outboxSelect is the column list scanRow reads.
const outboxSelect = `id, event_id, topic, k, seq, type, source, content_type, headers, payload, created_at, appended_at`

// scanRow reads one row of a SELECT of outboxSelect.
func scanRow(rows *sql.Rows) (outboxRow, error) {
	var r outboxRow
	var created int64
	var eventID, headers, key []byte
	ev := &ferryevent.Event{}
	if err := rows.Scan(&r.id, &eventID, &ev.Topic, &key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &created, &r.appended); err != nil {
		return r, err
	}
	ev.Key, ev.CreatedAt = string(key), fromMicros(created)
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	r.ev = ev
	u, err := uuid.FromBytes(eventID)
	if err == nil {
		ev.ID = u
		err = decodeHeaders(ev, headers)
	}
	if err == nil {
		err = ferryevent.CheckRelayable(ev)
	}
	if err != nil {
		r.invalid = fmt.Sprintf("invalid outbox row %d: %v", r.id, err)
	}
	return r, nil
}

type tableMapKey struct {
	id      uint64
	columns uint64
}

// outboxColumns are the positions of ferry_outbox's columns in a table
// map's rows (read by name: binlog_row_metadata = FULL).
type outboxColumns struct {
	id, p, eventID, topic, k, seq, typ, source, contentType, headers, payload, createdAt, appendedAt int
}

func (f *feed) outboxColumns(t *replication.TableMapEvent) (*outboxColumns, error) {
	key := tableMapKey{id: t.TableID, columns: t.ColumnCount}
	if c, ok := f.columns[key]; ok {
		return c, nil
	}
	names := t.ColumnNameString()
	at := map[string]int{}
	for i, n := range names {
		at[n] = i
	}
	c := &outboxColumns{}
	for name, dst := range map[string]*int{"id": &c.id, "p": &c.p, "event_id": &c.eventID, "topic": &c.topic, "k": &c.k, "seq": &c.seq,
		"type": &c.typ, "source": &c.source, "content_type": &c.contentType, "headers": &c.headers, "payload": &c.payload,
		"created_at": &c.createdAt, "appended_at": &c.appendedAt} {
		i, ok := at[name]
		if !ok {
			return nil, fmt.Errorf("ferrymysql: read the binlog (%s): %w: the binlog's map of %s.ferry_outbox has no column %s (columns %v): binlog_row_metadata must be FULL, and the table Ferry's migrations made",
				f.name, ferrydriver.ErrMisconfigured, f.d.schema, name, names)
		}
		*dst = i
	}
	if f.columns == nil || len(f.columns) >= 64 {
		f.columns = map[tableMapKey]*outboxColumns{}
	}
	f.columns[key] = c
	return c, nil
}

// bytesOf copies a column's value (the row's strings share the event's
// buffer).
func bytesOf(v any) []byte {
	switch x := v.(type) {
	case string:
		return []byte(x)
	case []byte:
		return append([]byte(nil), x...)
	}
	return nil
}

func (c *outboxColumns) int(row []any, i int) int64 {
	switch x := row[i].(type) {
	case int64:
		return x
	case int32:
		return int64(x)
	case int16:
		return int64(x)
	case int8:
		return int64(x)
	case uint64:
		return int64(x)
	case uint32:
		return int64(x)
	}
	return -1
}

// row decodes a row image of the outbox.
func (c *outboxColumns) row(row []any) outboxRow {
	ev := &ferryevent.Event{Topic: string(bytesOf(row[c.topic])), Key: string(bytesOf(row[c.k])), Seq: c.int(row, c.seq),
		Type: string(bytesOf(row[c.typ])), Source: string(bytesOf(row[c.source])), ContentType: string(bytesOf(row[c.contentType])),
		Payload: bytesOf(row[c.payload]), CreatedAt: fromMicros(c.int(row, c.createdAt))}
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	r := outboxRow{ev: ev, id: c.int(row, c.id), appended: c.int(row, c.appendedAt)}
	// BINARY(16) is padded with zero bytes, which the binlog's row image
	// leaves out: a UUID that ends in zeros arrives shorter.
	raw := bytesOf(row[c.eventID])
	if len(raw) < 16 {
		raw = append(raw, make([]byte, 16-len(raw))...)
	}
	id, err := uuid.FromBytes(raw)
	if err != nil {
		r.invalid = fmt.Sprintf("invalid outbox row %d: event_id: %v", r.id, err)
		return r
	}
	ev.ID = id
	if err := decodeHeaders(ev, bytesOf(row[c.headers])); err != nil {
		r.invalid = "invalid outbox row: " + err.Error()
	} else if err := ferryevent.CheckRelayable(ev); err != nil {
		r.invalid = "invalid outbox row: " + err.Error()
	}
	return r
}
