package ferrysqlite

import (
	"sync"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

// commitEvents tells readers in this process that the write handle
// committed: feeds wait on changed(), AwaitSettled callers subscribe to the
// events they wait for. Finished inbox rows are noted while their
// transaction runs and announced only when it commits. The write handle has
// one connection, so at most one transaction is open at a time and its
// notes are the pending ones.
type commitEvents struct {
	mu      sync.Mutex
	gen     chan struct{}
	pending []settledNote
	subs    map[uuid.UUID]map[*settleSub]struct{}
}

type settledNote struct {
	group string
	id    uuid.UUID
	state ferrydriver.InboxState
}

type settleSub struct {
	group string
	notes chan settledNote
	dirty chan struct{} // a note did not fit: read every state again
}

func newCommitEvents() *commitEvents {
	return &commitEvents{gen: make(chan struct{}), subs: map[uuid.UUID]map[*settleSub]struct{}{}}
}

// changed returns a channel closed at the next commit.
func (e *commitEvents) changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

func (e *commitEvents) note(n settledNote) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// Kept whether or not anyone waits yet: a caller may subscribe before
	// the commit, after its one read of the row.
	e.pending = append(e.pending, n)
}

func (e *commitEvents) committed() {
	e.mu.Lock()
	defer e.mu.Unlock()
	close(e.gen)
	e.gen = make(chan struct{})
	for _, n := range e.pending {
		for s := range e.subs[n.id] {
			if s.group != n.group {
				continue
			}
			select {
			case s.notes <- n:
			default:
				select {
				case s.dirty <- struct{}{}:
				default:
				}
			}
		}
	}
	e.pending = e.pending[:0]
}

func (e *commitEvents) rolledBack() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending = e.pending[:0]
}

func (e *commitEvents) subscribe(group string, ids []uuid.UUID) (*settleSub, func()) {
	s := &settleSub{group: group, notes: make(chan settledNote, len(ids)), dirty: make(chan struct{}, 1)}
	e.mu.Lock()
	for _, id := range ids {
		m := e.subs[id]
		if m == nil {
			m = map[*settleSub]struct{}{}
			e.subs[id] = m
		}
		m[s] = struct{}{}
	}
	e.mu.Unlock()
	return s, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, id := range ids {
			delete(e.subs[id], s)
			if len(e.subs[id]) == 0 {
				delete(e.subs, id)
			}
		}
	}
}
