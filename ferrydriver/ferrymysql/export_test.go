package ferrymysql

import (
	"context"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// ListInboxQuery is ListInbox's statement, for the plan tests.
func ListInboxQuery(p *ferrydriver.ListInboxParams) (string, []any, error) { return listInboxQuery(p) }

// InboxCountsQuery is InboxCounts' statement and arguments.
func InboxCountsQuery(group string) (string, []any) {
	return sqlInboxCounts, inboxCountsArgs(group)
}

// ClaimHeadsQuery is a claim's reading of the heads of keys.
func ClaimHeadsQuery(group string, keys []string) (string, []any) {
	args := []any{group, group}
	for _, k := range keys {
		args = append(args, k)
	}
	return claimHeadsQuery(len(keys)), args
}

// InboxGroupsQuery is InboxGroups' statement.
const InboxGroupsQuery = sqlInboxGroups

// InboxDeadReasonsQuery is InboxDeadReasons' statement (without its SET STATEMENT prefix).
var InboxDeadReasonsQuery = strings.TrimPrefix(sqlReasonsInboxDead, "SET STATEMENT group_concat_max_len = 16777216 FOR\n")

// Reruns counts the driver's transactions that ran again after a deadlock
// or a lock wait timeout.
func (d *Driver) Reruns() int64 { return d.reruns.Load() }

// Duplicates counts ingestions that ran again after meeting a concurrent
// delivery of their events.
func (d *Driver) Duplicates() int64 { return d.duplicates.Load() }

// SettleNotes counts the waiters the binlog reader woke.
func (d *Driver) SettleNotes() int64 {
	d.settle.mu.Lock()
	defer d.settle.mu.Unlock()
	return d.settle.notes
}

// SettleWaiters counts the AwaitSettled calls waiting (subscribed, their
// first read done and some of their events not settled), and whether the
// binlog reader runs.
func (d *Driver) SettleWaiters() (int, bool) {
	d.settle.mu.Lock()
	defer d.settle.mu.Unlock()
	return d.settle.listening, d.settle.r != nil
}

// Retention's statements.
const (
	DeleteProcessedQuery = sqlDeleteProcessed
	ForgetKeysQuery      = sqlForgetKeys
)

// SaveCheckpointStopped is SaveCheckpoint stopped after its fence (the
// lease's row locked) until resume is closed, as a relay's process would
// be if it were stopped there; fenced is closed when it stops.
func (d *Driver) SaveCheckpointStopped(ctx context.Context, p *ferrydriver.SaveCheckpointParams, fenced chan<- struct{}, resume <-chan struct{}) error {
	return d.saveCheckpoint(ctx, p, func() {
		close(fenced)
		<-resume
	})
}

// ClaimRunsQuery is a claim's reading of the runs after the keys' heads
// (positions), none blocked.
func ClaimRunsQuery(group string, keys []string, heads []int64, n int) (string, []any) {
	var hs []*claimHead
	for i, k := range keys {
		hs = append(hs, &claimHead{key: k, pos: heads[i], blocker: noHead})
	}
	return claimRunsQuery(group, hs, n)
}

// SetFeedLimits makes the driver's feeds hold at most holdRows rows of a
// transaction in memory, read at most readEvents binlog events a Read, and
// read the oldest open transaction every openEvery.
func (d *Driver) SetFeedLimits(holdRows, readEvents int, openEvery time.Duration) {
	d.feedLimits = &feedLimits{holdRows: holdRows, readEvents: readEvents, openEvery: openEvery}
}

// Rereads counts the transactions too large to hold that a feed read
// twice.
func (d *Driver) Rereads() int64 { return d.rereads.Load() }

// ForeignRows counts the rows events of tables other than the outbox that
// a feed of the driver received decoded.
func ForeignRows(f ferrydriver.Feed) int { return f.(*feed).foreignRows }
