package ferryui

import (
	"context"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// A filter that no index serves (an event type or topic; a key, over a
// group's finished events other than DEAD ones) would make the database
// walk every row of the list for a rare value. Such a filter is applied
// here instead, to a walk of the unfiltered list that reads at most
// filterScan rows (?scan=, up to maxFilterScan) from where the page
// starts: a page then holds the matches among those rows, and its "next"
// says where the walk goes on, whether or not the page is full.
const (
	filterScan    = 10_000
	maxFilterScan = 100_000
	// maxUnfinishedScan bounds the walk of PENDING, PROCESSING or FAILED
	// rows, which page by no cursor: one read of whole rows.
	maxUnfinishedScan = 2_000
)

// scanParam reads ?scan=.
func scanParam(q url.Values) (int, error) {
	v := q.Get("scan")
	if v == "" {
		return filterScan, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxFilterScan {
		return 0, badRequest("scan=%q is not a count of rows to read: use 1 to %d (default %d)", v, maxFilterScan, filterScan)
	}
	return n, nil
}

// page is a page of a list (relay dead letters, a group's rows) and
// where the next one starts (nil: the list ends here, or it pages by no
// cursor).
type page[T, C any] struct {
	items []T
	next  *C
	// scanned counts the rows read for a filter applied here; 0 when the
	// database applied the whole filter.
	scanned int
}

// walk reads a list a page of at most MaxPage at a time from after
// (read(after, n): the next n rows after the cursor, nil for the start),
// keeping the rows that match, until it holds limit of them, has read
// scan rows or reached the end. cursor is the cursor after a row.
func walk[T, C any](after *C, limit, scan int, read func(after *C, n int) ([]T, error), cursor func(T) *C, match func(T) bool) (*page[T, C], error) {
	p := &page[T, C]{}
	for p.scanned < scan && len(p.items) < limit {
		n := min(MaxPage, scan-p.scanned)
		rows, err := read(after, n)
		if err != nil {
			return nil, err
		}
		for i, r := range rows {
			if match(r) {
				p.items = append(p.items, r)
			}
			after = cursor(r)
			if len(p.items) == limit {
				p.scanned += i + 1
				p.next = after
				return p, nil
			}
		}
		p.scanned += len(rows)
		if len(rows) < n {
			return p, nil // the end of the list
		}
	}
	p.next = after
	return p, nil
}

func deadLetterCursor(dl *ferrydriver.DeadLetter) *ferrydriver.DeadLetterCursor {
	return &ferrydriver.DeadLetterCursor{FailedAt: dl.FailedAt, EventID: dl.Event.ID}
}

// pageDeadLetters lists dead letters matching f after after, limit at
// most. Every backend serves a partition, a key and a time range by
// index; a feed's partitions, a type, a topic or a reason are matched
// here, over at most scan dead letters.
func (h *Handler) pageDeadLetters(ctx context.Context, f uiapi.Filter, after *ferrydriver.DeadLetterCursor, limit, scan int) (*page[*ferrydriver.DeadLetter, ferrydriver.DeadLetterCursor], error) {
	exact, family := driverkit.FeedFilter(f.Feed)
	list := ferrydriver.ListDeadLettersParams{Feed: exact, Key: f.Key, Since: f.Since, Until: f.Until}
	read := func(after *ferrydriver.DeadLetterCursor, n int) ([]*ferrydriver.DeadLetter, error) {
		l := list
		l.After, l.Limit = after, n
		return h.cfg.Store.ListDeadLetters(ctx, &l)
	}
	if f.Type == "" && f.Topic == "" && f.Reason == "" && family == "" {
		dls, err := read(after, limit)
		if err != nil {
			return nil, err
		}
		p := &page[*ferrydriver.DeadLetter, ferrydriver.DeadLetterCursor]{items: dls}
		if len(dls) == limit {
			p.next = deadLetterCursor(dls[len(dls)-1])
		}
		return p, nil
	}
	return walk(after, limit, scan, read, deadLetterCursor, func(dl *ferrydriver.DeadLetter) bool {
		return (f.Type == "" || dl.Event.Type == f.Type) && (f.Topic == "" || dl.Event.Topic == f.Topic) &&
			strings.Contains(dl.Reason, f.Reason) && driverkit.InFeed(f.Feed, dl.Feed)
	})
}

// servedKeyStates are the states whose rows every backend finds by key
// through an index (a key's unfinished rows, the DEAD ones included).
var servedKeyStates = []ferrydriver.InboxState{ferrydriver.InboxPending, ferrydriver.InboxProcessing, ferrydriver.InboxFailed, ferrydriver.InboxDead}

// pageInbox lists a group's rows matching p (p.Limit at most). A type, or
// a key over states that no key index covers, is matched here over at
// most scan rows: of finished states a page at a time from p.After; of
// unfinished ones, which page by no cursor, the newest scan rows (at most
// maxUnfinishedScan).
func pageInbox(ctx context.Context, in Inbox, p ferrydriver.ListInboxParams, scan int) (*page[*ferrydriver.InboxRow, ferrydriver.InboxCursor], error) {
	finished := driverkit.CheckInboxCursor(&ferrydriver.ListInboxParams{States: p.States, After: &ferrydriver.InboxCursor{}}) == nil
	keyServed := true
	for _, st := range p.States {
		keyServed = keyServed && slices.Contains(servedKeyStates, st)
	}
	read := func(after *ferrydriver.InboxCursor, n int) ([]*ferrydriver.InboxRow, error) {
		l := p
		l.After, l.Limit = after, n
		return in.ListInbox(ctx, &l)
	}
	if p.Type == "" && (p.Key == "" || keyServed) {
		rows, err := read(p.After, p.Limit)
		if err != nil {
			return nil, err
		}
		out := &page[*ferrydriver.InboxRow, ferrydriver.InboxCursor]{items: rows}
		if finished && len(rows) == p.Limit {
			out.next = driverkit.InboxCursorOf(rows[len(rows)-1])
		}
		return out, nil
	}
	key, typ := p.Key, p.Type
	if keyServed {
		key = "" // the database's, by index
	} else {
		p.Key = ""
	}
	p.Type = ""
	match := func(r *ferrydriver.InboxRow) bool {
		return (key == "" || r.Event.Key == key) && (typ == "" || r.Event.Type == typ)
	}
	if finished {
		return walk(p.After, p.Limit, scan, read, driverkit.InboxCursorOf, match)
	}
	rows, err := read(nil, min(scan, maxUnfinishedScan))
	if err != nil {
		return nil, err
	}
	out := &page[*ferrydriver.InboxRow, ferrydriver.InboxCursor]{scanned: len(rows)}
	for _, r := range rows {
		if match(r) && len(out.items) < p.Limit {
			out.items = append(out.items, r)
		}
	}
	return out, nil
}
