package ferrychain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
	"github.com/ferry-dev/ferry/ferrysink"
)

// cursor is the source's saved position: the last block whose logs reached
// the inbox, and the recent blocks before it (number, hash, parent, and
// the IDs of the events ingested from each), to find a reorg's common
// ancestor and the events to retract.
type cursor struct {
	ChainID uint64  `json:"chain_id"`
	Tier    string  `json:"tier,omitempty"` // the tier it last ran at, for status
	Window  []entry `json:"window"`         // ascending; the last is the cursor
	Reorgs  uint64  `json:"reorgs"`
	// Orphaned counts, per block hash, how often a reorg orphaned the
	// block: if it becomes canonical again (a reorg back), its logs are
	// new events, with IDs of a new incarnation, since the old ones stay
	// RETRACTED.
	Orphaned []orphan `json:"orphaned,omitempty"`
}

type orphan struct {
	Number uint64      `json:"n"`
	Hash   common.Hash `json:"h"`
	Times  uint32      `json:"t"`
}

// incarnation is how often block hash h was orphaned before.
func (c *cursor) incarnation(h common.Hash) uint32 {
	for _, o := range c.Orphaned {
		if o.Hash == h {
			return o.Times
		}
	}
	return 0
}

func (c *cursor) orphan(e entry) {
	for i := range c.Orphaned {
		if c.Orphaned[i].Hash == e.Hash {
			c.Orphaned[i].Times++
			return
		}
	}
	c.Orphaned = append(c.Orphaned, orphan{Number: e.Number, Hash: e.Hash, Times: 1})
}

type entry struct {
	Number uint64      `json:"n"`
	Hash   common.Hash `json:"h"`
	Parent common.Hash `json:"p"`
	Events []uuid.UUID `json:"e,omitempty"`
}

func (c *cursor) last() (entry, bool) {
	if len(c.Window) == 0 {
		return entry{}, false
	}
	return c.Window[len(c.Window)-1], true
}

// Source ingests a chain's logs into a consumer group's inbox: in chain
// order, each log once, at the group's confirmation tier, retracting the
// events of blocks a reorg orphaned.
type Source struct {
	cfg     Config
	store   ferrydriver.Store
	inbox   Inbox
	name    string
	holder  string
	chainID uint64
	m       *metrics

	mu     sync.Mutex
	status Status
}

// Status is what `ferry status` shows of a source.
type Status struct {
	Group         string
	Tier          string
	Head, Cursor  uint64
	CursorHash    common.Hash
	Reorgs        uint64
	MaxReorgDepth uint64
	HeadMovedAt   time.Time
}

// New returns a source feeding inbox. store keeps its cursor (a fenced
// checkpoint) and lease.
func New(store ferrydriver.Store, inbox Inbox, cfg *Config) (*Source, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if store == nil || inbox == nil {
		return nil, errors.New("ferrychain: New needs a store (the driver) and an inbox (a ferry.Consumer)")
	}
	name := c.Name
	if name == "" {
		name = inbox.Group()
	}
	holder := c.Holder
	if holder == "" {
		host, _ := os.Hostname()
		holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	m, err := newMetrics(c.Hooks, inbox.Group())
	if err != nil {
		return nil, err
	}
	return &Source{cfg: c, store: store, inbox: inbox, name: "chain/" + name, holder: holder, m: m,
		status: Status{Group: inbox.Group(), Tier: c.Tier.String()}}, nil
}

// Status returns the source's latest view.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Run ingests until ctx ends (nil) or a reorg goes deeper than the tier
// promised under the Halt policy (ErrDeepReorg). It holds a lease, so that
// one source per name runs at a time; a standby waits for it.
func (s *Source) Run(ctx context.Context) error {
	retry := backoff.Policy{Base: 200 * time.Millisecond, Max: 30 * time.Second}
	for attempt := 1; ctx.Err() == nil; attempt++ {
		lease, err := s.store.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: s.name, Holder: s.holder, TTL: s.cfg.LeaseTTL})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.cfg.Logger.Warn("ferrychain: cannot reach the store; retrying", "err", err, "attempt", attempt)
			retry.Sleep(ctx.Done(), attempt)
			continue
		}
		if !lease.Held(s.holder) {
			sleep(ctx, s.cfg.LeaseTTL/4)
			continue
		}
		began := time.Now()
		err = s.lead(ctx, lease.Term)
		if time.Since(began) > s.cfg.LeaseTTL {
			attempt = 1 // it had been running: back off from the start
		}
		if errors.Is(err, ErrDeepReorg) {
			return err
		}
		if err != nil && ctx.Err() == nil {
			s.m.rpcErrors.Inc()
			s.cfg.Logger.Warn("ferrychain: source stopped after an error; retrying", "err", err, "attempt", attempt)
			retry.Sleep(ctx.Done(), attempt)
			continue
		}
		attempt = 0
	}
	return nil
}

// lead runs while the lease is held.
func (s *Source) lead(ctx context.Context, term int64) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go s.keepLease(ctx, cancel, term)

	cp, err := s.store.LoadCheckpoint(ctx, s.name)
	if err != nil {
		return err
	}
	var cur cursor
	if len(cp.Cursor) > 0 {
		if err := json.Unmarshal(cp.Cursor, &cur); err != nil {
			return fmt.Errorf("ferrychain: the saved cursor of %s is not a chain cursor: %w", s.name, err)
		}
	}
	client, err := s.cfg.Dial(ctx)
	if err != nil {
		return fmt.Errorf("ferrychain: dial the node: %w", err)
	}
	if cl, ok := client.(interface{ Close() }); ok {
		defer cl.Close()
	}
	id, err := client.ChainID(ctx)
	if err != nil {
		return fmt.Errorf("ferrychain: read the chain ID: %w", err)
	}
	s.chainID = id.Uint64()
	if cur.ChainID != 0 && cur.ChainID != s.chainID {
		return fmt.Errorf("%w: the saved cursor of %s is for chain %d but the node serves chain %d; point Dial at the right network or use another Name",
			ErrDeepReorg, s.name, cur.ChainID, s.chainID)
	}
	cur.ChainID, cur.Tier = s.chainID, s.cfg.Tier.String()
	r := &run{s: s, client: client, cur: &cur, term: term}

	heads := make(chan *types.Header, 16)
	if sub, err := client.SubscribeNewHead(ctx, heads); err == nil {
		defer sub.Unsubscribe()
		go func() {
			select {
			case err := <-sub.Err():
				if err != nil && ctx.Err() == nil {
					// The subscription dropped: reconnect through Run,
					// which reads from the saved cursor (no gap).
					cancel(fmt.Errorf("ferrychain: head subscription ended: %w", err))
				}
			case <-ctx.Done():
			}
		}()
	} else if !errors.Is(err, rpc.ErrNotificationsUnsupported) {
		s.cfg.Logger.Warn("ferrychain: cannot subscribe to new heads; polling instead", "err", err)
	}
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()
	for {
		if err := r.step(ctx); err != nil {
			if ctx.Err() != nil {
				if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
					return cause
				}
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			return nil
		case <-heads:
		case <-poll.C:
		}
	}
}

// keepLease renews the lease; losing it ends lead.
func (s *Source) keepLease(ctx context.Context, cancel context.CancelCauseFunc, term int64) {
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.store.RenewLease(ctx, &ferrydriver.LeaseParams{Name: s.name, Holder: s.holder, Term: term, TTL: s.cfg.LeaseTTL}); err != nil {
			if errors.Is(err, ferrydriver.ErrLeaseLost) {
				cancel(err)
				return
			}
			s.cfg.Logger.Warn("ferrychain: lease renewal failed; will retry", "err", err)
		}
	}
}

// run is one leadership's state.
type run struct {
	s      *Source
	client Client
	cur    *cursor
	term   int64
	head   uint64
	moved  time.Time
	alerts map[string]bool
}

// save stores the cursor, fenced by the lease.
func (r *run) save(ctx context.Context) error {
	if over := len(r.cur.Window) - r.s.cfg.Window; over > 0 {
		r.cur.Window = slices.Delete(r.cur.Window, 0, over)
	}
	if len(r.cur.Window) > 0 {
		// A block below the window cannot come back.
		low := r.cur.Window[0].Number
		r.cur.Orphaned = slices.DeleteFunc(r.cur.Orphaned, func(o orphan) bool { return o.Number < low })
	}
	b, err := json.Marshal(r.cur)
	if err != nil {
		return err
	}
	if err := r.s.store.SaveCheckpoint(ctx, &ferrydriver.SaveCheckpointParams{Feed: r.s.name, Holder: r.s.holder, Term: r.term, Cursor: b}); err != nil {
		return fmt.Errorf("ferrychain: save the cursor: %w", err)
	}
	last, _ := r.cur.last()
	r.s.mu.Lock()
	r.s.status.Cursor, r.s.status.CursorHash, r.s.status.Reorgs = last.Number, last.Hash, r.cur.Reorgs
	r.s.mu.Unlock()
	r.s.m.cursor.Set(float64(last.Number))
	return nil
}

// step brings the inbox up to the tier's block.
func (r *run) step(ctx context.Context) error {
	head, err := r.client.HeaderByNumber(ctx, nil)
	if err != nil {
		return fmt.Errorf("ferrychain: read the head: %w", err)
	}
	r.observeHead(ctx, head.Number.Uint64())
	target, ok, err := r.target(ctx, head.Number.Uint64())
	if err != nil || !ok {
		return err
	}
	next := r.s.cfg.StartBlock
	if last, ok := r.cur.last(); ok {
		// Still canonical? A reorg may have replaced the cursor's block
		// without lengthening the chain.
		canon, err := r.client.HeaderByNumber(ctx, new(big.Int).SetUint64(last.Number))
		if errors.Is(err, ethereum.NotFound) {
			// The node's chain is shorter than the cursor for now (a reorg
			// under way, or a node behind its peers): wait for the next
			// head rather than retract anything on that alone.
			r.s.cfg.Logger.Debug("ferrychain: the cursor's block is not on the node's chain yet; waiting", "block", last.Number)
			return nil
		}
		if err != nil {
			return fmt.Errorf("ferrychain: read block %d: %w", last.Number, err)
		}
		if canon.Hash() != last.Hash {
			if err := r.reorg(ctx); err != nil {
				return err
			}
		}
		last, _ = r.cur.last()
		next = last.Number + 1
	}
	// Far behind: ranges of eth_getLogs up to a window below the target;
	// those blocks are deeper than any reorg the window can undo.
	for target >= next && target-next >= uint64(r.s.cfg.Window) {
		end := min(next+r.s.cfg.MaxRange-1, target-uint64(r.s.cfg.Window)+1)
		if err := r.catchUp(ctx, next, end); err != nil {
			return err
		}
		last, _ := r.cur.last()
		next = last.Number + 1
	}
	for n := next; n <= target; n++ {
		reorged, err := r.block(ctx, n)
		if err != nil {
			return err
		}
		if reorged {
			return nil // start again from the common ancestor
		}
	}
	return nil
}

// target is the highest block the tier lets through now.
func (r *run) target(ctx context.Context, head uint64) (uint64, bool, error) {
	t := r.s.cfg.Tier
	switch t.kind {
	case tierLatest:
		return head, true, nil
	case tierDepth:
		if head < t.depth {
			return 0, false, nil
		}
		return head - t.depth, true, nil
	}
	tag := rpc.SafeBlockNumber
	if t.kind == tierFinalized {
		tag = rpc.FinalizedBlockNumber
	}
	h, err := r.client.HeaderByNumber(ctx, big.NewInt(int64(tag)))
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return 0, false, nil // nothing is safe/finalized yet
		}
		return 0, false, fmt.Errorf("ferrychain: read the %s block: %w", t, err)
	}
	return h.Number.Uint64(), true, nil
}

func (r *run) observeHead(ctx context.Context, head uint64) {
	now := time.Now()
	if head != r.head || r.moved.IsZero() {
		r.head, r.moved = head, now
		delete(r.alerts, "head-stalled")
	}
	r.s.m.head.Set(float64(head))
	if last, ok := r.cur.last(); ok && head >= last.Number {
		r.s.m.lag.Set(float64(head - last.Number))
	}
	r.s.mu.Lock()
	r.s.status.Head, r.s.status.HeadMovedAt = head, r.moved
	r.s.mu.Unlock()
	if now.Sub(r.moved) > r.s.cfg.StallAfter && !r.alerts["head-stalled"] {
		if r.alerts == nil {
			r.alerts = map[string]bool{}
		}
		r.alerts["head-stalled"] = true
		r.s.alert(ctx, &Alert{Kind: "head-stalled", Message: fmt.Sprintf("the head has stayed at block %d for %v: is the node syncing?", head, now.Sub(r.moved).Round(time.Second))})
	}
}

// block ingests block n's logs, fetched by its hash. It reports a reorg
// (handled) when the block's parent is not the cursor.
func (r *run) block(ctx context.Context, n uint64) (bool, error) {
	h, err := r.client.HeaderByNumber(ctx, new(big.Int).SetUint64(n))
	if err != nil {
		return false, fmt.Errorf("ferrychain: read block %d: %w", n, err)
	}
	if last, ok := r.cur.last(); ok && h.ParentHash != last.Hash {
		return true, r.reorg(ctx)
	}
	hash := h.Hash()
	logs, err := r.client.FilterLogs(ctx, ethereum.FilterQuery{BlockHash: &hash, Addresses: r.s.cfg.Contracts, Topics: r.s.cfg.Topics})
	if err != nil {
		return false, fmt.Errorf("ferrychain: read the logs of block %d (%s): %w", n, hash.Hex(), err)
	}
	e := entry{Number: n, Hash: hash, Parent: h.ParentHash}
	if err := r.ingest(ctx, logs, h.Time, &e, r.cur.incarnation(hash)); err != nil {
		return false, err
	}
	r.cur.Window = append(r.cur.Window, e)
	return false, r.save(ctx)
}

// ingest puts logs in the inbox, in log order, and records their IDs.
func (r *run) ingest(ctx context.Context, logs []types.Log, blockTime uint64, e *entry, incarnation uint32) error {
	if len(logs) == 0 {
		return nil
	}
	slices.SortFunc(logs, func(a, b types.Log) int {
		if a.BlockNumber != b.BlockNumber {
			return int(a.BlockNumber) - int(b.BlockNumber)
		}
		return int(a.Index) - int(b.Index)
	})
	events := make([]*ferryevent.Event, 0, len(logs))
	for i := range logs {
		if logs[i].Removed {
			continue
		}
		t := blockTime
		if t == 0 {
			t = logs[i].BlockTimestamp
		}
		ev := r.s.event(&logs[i], t, incarnation)
		events = append(events, ev)
		if e != nil {
			e.Events = append(e.Events, ev.ID)
		}
	}
	if _, err := r.s.inbox.Ingest(ferrysink.WithSystem(ctx, System), events); err != nil {
		return fmt.Errorf("ferrychain: ingest %d events: %w", len(events), err)
	}
	r.s.m.ingested.Add(float64(len(events)))
	return nil
}

// catchUp ingests blocks from..to with eth_getLogs ranges (halved when the
// provider refuses one) and moves the cursor to to.
func (r *run) catchUp(ctx context.Context, from, to uint64) error {
	for start := from; start <= to; {
		end := to
		for {
			logs, err := r.client.FilterLogs(ctx, ethereum.FilterQuery{FromBlock: new(big.Int).SetUint64(start), ToBlock: new(big.Int).SetUint64(end),
				Addresses: r.s.cfg.Contracts, Topics: r.s.cfg.Topics})
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if end > start {
					r.s.m.rpcErrors.Inc()
					r.s.cfg.Logger.Info("ferrychain: the provider refused a log range; halving it", "from", start, "to", end, "err", err)
					end = start + (end-start)/2
					continue
				}
				return fmt.Errorf("ferrychain: read the logs of block %d: %w", start, err)
			}
			if err := r.ingest(ctx, logs, 0, nil, 0); err != nil {
				return err
			}
			break
		}
		h, err := r.client.HeaderByNumber(ctx, new(big.Int).SetUint64(end))
		if err != nil {
			return fmt.Errorf("ferrychain: read block %d: %w", end, err)
		}
		// Deep blocks: the window restarts here.
		r.cur.Window = []entry{{Number: end, Hash: h.Hash(), Parent: h.ParentHash}}
		if err := r.save(ctx); err != nil {
			return err
		}
		start = end + 1
	}
	return nil
}

// reorg walks the window back to the common ancestor, retracts the events
// of the orphaned blocks and moves the cursor to the ancestor. The
// canonical blocks are ingested by the next step.
func (r *run) reorg(ctx context.Context) error {
	var orphaned []entry
	i := len(r.cur.Window) - 1
	for ; i >= 0; i-- {
		e := r.cur.Window[i]
		canon, err := r.client.HeaderByNumber(ctx, new(big.Int).SetUint64(e.Number))
		if errors.Is(err, ethereum.NotFound) && i == len(r.cur.Window)-1 {
			return nil // the chain is shorter for now: decide when it has grown
		}
		if err != nil && !errors.Is(err, ethereum.NotFound) {
			return fmt.Errorf("ferrychain: read block %d while looking for a reorg's common ancestor: %w", e.Number, err)
		}
		if err == nil && canon.Hash() == e.Hash {
			break
		}
		orphaned = append(orphaned, e)
	}
	depth := uint64(len(orphaned))
	if i < 0 {
		msg := fmt.Sprintf("a reorg replaced all %d blocks the cursor remembers (down to block %d): the common ancestor is beyond the window; "+
			"raise Config.Window, then reset the cursor (ferry chain reset) to re-read from a block you trust", len(r.cur.Window), r.cur.Window[0].Number)
		r.s.alert(ctx, &Alert{Kind: "reorg-beyond-window", Message: msg, Depth: depth})
		return fmt.Errorf("%w: %s", ErrDeepReorg, msg)
	}
	var ids []uuid.UUID
	for _, e := range orphaned {
		ids = append(ids, e.Events...)
	}
	r.s.m.reorgs.Inc()
	r.s.m.reorgDepth.Observe(float64(depth))
	r.s.mu.Lock()
	r.s.status.MaxReorgDepth = max(r.s.status.MaxReorgDepth, depth)
	r.s.mu.Unlock()
	ancestor := r.cur.Window[i]
	r.s.cfg.Logger.Warn("ferrychain: reorg", "depth", depth, "ancestor", ancestor.Number, "ancestor_hash", ancestor.Hash.Hex(), "retracted_events", len(ids))
	if len(ids) > 0 && r.s.cfg.Tier.kind != tierLatest {
		// This tier promised the group would not see a reorg this deep.
		msg := fmt.Sprintf("a reorg of depth %d orphaned blocks %d-%d whose %d events group %s (tier %s) already received",
			depth, orphaned[len(orphaned)-1].Number, orphaned[0].Number, len(ids), r.s.inbox.Group(), r.s.cfg.Tier)
		r.s.alert(ctx, &Alert{Kind: "deep-reorg", Message: msg, Depth: depth})
		if *r.s.cfg.DeepReorg == Halt {
			return fmt.Errorf("%w: %s; the source halted without retracting them: inspect the group's effects, then restart it with DeepReorg: RetractAndContinue to retract and go on",
				ErrDeepReorg, msg)
		}
	}
	if len(ids) > 0 {
		found, err := r.s.inbox.Lookup(ctx, ids)
		if err != nil {
			return fmt.Errorf("ferrychain: read the orphaned events: %w", err)
		}
		events := make([]*ferryevent.Event, 0, len(found))
		for _, id := range ids {
			if ev, ok := found[id]; ok {
				events = append(events, ev)
			}
		}
		if _, err := r.s.inbox.Retract(ctx, events); err != nil {
			return fmt.Errorf("ferrychain: retract the events of %d orphaned blocks: %w", depth, err)
		}
		r.s.m.retracted.Add(float64(len(events)))
	}
	for _, e := range orphaned {
		r.cur.orphan(e)
	}
	r.cur.Window = r.cur.Window[:i+1]
	r.cur.Reorgs++
	return r.save(ctx)
}

func (s *Source) alert(ctx context.Context, a *Alert) {
	a.Group = s.inbox.Group()
	s.cfg.Logger.Error("ferrychain: "+a.Message, "alert", a.Kind, "group", a.Group, "depth", a.Depth)
	if s.cfg.OnAlert != nil {
		s.cfg.OnAlert(ctx, a)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
