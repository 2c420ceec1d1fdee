package ferrychain_test

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/ethclient/simulated"
	"github.com/ethereum/go-ethereum/node"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrychain"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryshared/tcpproxy"
)

// The tests run a chain on go-ethereum's simulated backend, which can fork.
// Its gotchas, and how the tests live with them:
//   - Fork(parent) starts a side chain that becomes canonical only once it
//     is longer (or, at equal length, by chance): the tests always build the
//     new branch one block longer than the old one.
//   - Transactions of orphaned blocks go back to the mempool
//     asynchronously, and the miner may include them in any later block,
//     at another log index: the tests commit blocks until the receipts of
//     every sent transaction are found, and compare effects by
//     transaction, not by block.
//   - "safe" equals "latest" on the simulated backend and "finalized" moves
//     in 32-block steps: the tier tests use confirmations.
//   - The log at the fork point is not re-sent by this source: it reads
//     logs by block hash, and the fork point's hash did not change.

// logger is a contract whose code logs its calldata under one topic:
// CALLDATACOPY(0, 0, size); LOG1(0, size, topic); STOP.
var (
	contract = common.HexToAddress("0x00000000000000000000000000000000000c0de0")
	topic    = crypto.Keccak256Hash([]byte("Noted(bytes)"))
)

func loggerCode() []byte {
	code := []byte{0x36, 0x60, 0x00, 0x60, 0x00, 0x37, 0x7f}
	code = append(code, topic.Bytes()...)
	return append(code, 0x36, 0x60, 0x00, 0xa1, 0x00)
}

// chain is a simulated chain with two funded accounts: the second sends
// the new branch's transactions, so that a fork's blocks always differ
// from the ones they replace.
type chain struct {
	t       *testing.T
	backend *simulated.Backend
	client  simulated.Client
	keys    [2]*ecdsa.PrivateKey
	nonces  [2]uint64
	sent    map[string]common.Hash // note -> tx hash
}

func newChain(t *testing.T, opts ...func(*node.Config, *ethconfig.Config)) *chain {
	c := &chain{t: t, sent: map[string]common.Hash{}}
	alloc := types.GenesisAlloc{contract: {Code: loggerCode(), Balance: big.NewInt(0)}}
	for i := range c.keys {
		key, err := crypto.GenerateKey()
		require.NoError(t, err)
		c.keys[i] = key
		alloc[crypto.PubkeyToAddress(key.PublicKey)] = types.Account{Balance: new(big.Int).Mul(big.NewInt(1e18), big.NewInt(1000))}
	}
	c.backend = simulated.NewBackend(alloc, opts...)
	t.Cleanup(func() { _ = c.backend.Close() })
	c.client = c.backend.Client()
	return c
}

// note sends, from account who, a transaction whose log says note (mined
// by the next commit).
func (c *chain) note(who int, note string) common.Hash {
	c.t.Helper()
	ctx := context.Background()
	tx := types.MustSignNewTx(c.keys[who], types.LatestSignerForChainID(big.NewInt(1337)), &types.DynamicFeeTx{
		// The second account tips more: the miner puts its transactions
		// first, so re-mined ones get other log indexes.
		ChainID: big.NewInt(1337), Nonce: c.nonces[who], GasTipCap: big.NewInt(int64(1+who) * 1e9), GasFeeCap: big.NewInt(100e9), Gas: 100000,
		To: &contract, Data: []byte(note),
	})
	require.NoError(c.t, c.client.SendTransaction(ctx, tx))
	c.nonces[who]++
	c.sent[note] = tx.Hash()
	return tx.Hash()
}

func (c *chain) commit() common.Hash { return c.backend.Commit() }

func (c *chain) header(n uint64) *types.Header {
	h, err := c.client.HeaderByNumber(context.Background(), new(big.Int).SetUint64(n))
	require.NoError(c.t, err)
	return h
}

func (c *chain) head() uint64 {
	n, err := c.client.BlockNumber(context.Background())
	require.NoError(c.t, err)
	return n
}

// mineAll commits blocks until every sent transaction has a receipt on the
// canonical chain (orphaned ones come back to the mempool in their own time).
func (c *chain) mineAll() {
	c.t.Helper()
	for range 50 {
		all := true
		for _, h := range c.sent {
			if _, err := c.client.TransactionReceipt(context.Background(), h); err != nil {
				all = false
				break
			}
		}
		if all {
			return
		}
		time.Sleep(20 * time.Millisecond)
		c.commit()
	}
	c.t.Fatal("sent transactions were not all mined")
}

// group is a consumer group with its effects recorded in a table: one row
// per handled event (+1) and per retraction (-1), with the note.
type group struct {
	name    string
	table   string
	drv     *ferrypg.Driver[pgx.Tx]
	c       *ferry.Consumer[pgx.Tx]
	handled atomic.Int64
}

func newGroup(t *testing.T, drv *ferrypg.Driver[pgx.Tx], name string, hooks ...ferryhook.Hook) *group {
	table := pgx.Identifier{drv.Schema(), "effects_" + name}.Sanitize()
	_, err := ferrypgtest.Pool(t).Exec(context.Background(), `CREATE TABLE `+table+` (
		n bigserial PRIMARY KEY, event_id uuid NOT NULL, note text NOT NULL, block bigint NOT NULL, log_index int NOT NULL, sign int NOT NULL)`)
	require.NoError(t, err)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: name, PollInterval: 10 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Hooks: hooks})
	require.NoError(t, err)
	g := &group{name: name, table: table, drv: drv, c: c}
	record := func(sign int) ferry.HandlerFunc[pgx.Tx] {
		return func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
			p, err := ferrychain.DecodeLog(ev)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+table+` (event_id, note, block, log_index, sign) VALUES ($1, $2, $3, $4, $5)`,
				ev.ID, string(p.Data), p.BlockNumber, p.LogIndex, sign)
			g.handled.Add(1)
			return err
		}
	}
	c.HandleAll(record(1))
	c.HandleRetraction(record(-1))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return g
}

// net returns the net effect per note (handled minus retracted).
func (g *group) net(t *testing.T) map[string]int {
	rows, err := ferrypgtest.Pool(t).Query(context.Background(), `SELECT note, sum(sign)::int FROM `+g.table+` GROUP BY note`)
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var note string
		var n int
		require.NoError(t, rows.Scan(&note, &n))
		out[note] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func (g *group) count(t *testing.T, where string, args ...any) int {
	var n int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM `+g.table+` WHERE `+where, args...).Scan(&n))
	return n
}

// settle waits until the group's inbox has nothing left to run.
func (g *group) settle(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		counts, err := g.drv.InboxCounts(context.Background(), g.name)
		require.NoError(t, err)
		return counts[ferrydriver.InboxPending]+counts[ferrydriver.InboxProcessing]+counts[ferrydriver.InboxFailed] == 0
	}, 20*time.Second, 10*time.Millisecond)
}

// runSource runs a source for g, with hooks, until the returned stop is
// called.
func runSource(t *testing.T, drv *ferrypg.Driver[pgx.Tx], g *group, c *chain, tier ferrychain.Tier, wrap func(ferrychain.Inbox) ferrychain.Inbox, hooks ...ferryhook.Hook) (stop func() error) {
	t.Helper()
	var inbox ferrychain.Inbox = g.c
	if wrap != nil {
		inbox = wrap(inbox)
	}
	src, err := ferrychain.New(drv, inbox, &ferrychain.Config{
		// The chain's client is shared: the source must not close it.
		Dial:         func(context.Context) (ferrychain.Client, error) { return struct{ ferrychain.Client }{c.client}, nil },
		Contracts:    []common.Address{contract},
		Tier:         tier,
		Window:       16,
		PollInterval: 20 * time.Millisecond,
		LeaseTTL:     time.Second,
		Holder:       "test",
		Hooks:        hooks,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	var once sync.Once
	var result error
	return func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(10 * time.Second):
				result = errors.New("the source did not stop")
			}
		})
		return result
	}
}

// waitCursor waits until the group's chain cursor reaches block n.
func waitCursor(t *testing.T, drv *ferrypg.Driver[pgx.Tx], g *group, c *chain, n uint64) {
	t.Helper()
	want := c.header(n).Hash()
	require.Eventually(t, func() bool {
		cp, err := drv.LoadCheckpoint(context.Background(), "chain/"+g.name)
		require.NoError(t, err)
		return len(cp.Cursor) > 0 && containsHash(cp.Cursor, want)
	}, 20*time.Second, 10*time.Millisecond, "the cursor never reached block %d", n)
}

// containsHash reports whether a saved cursor (JSON) names block hash h
// as its last block.
func containsHash(cursor []byte, h common.Hash) bool {
	var cur struct {
		Window []struct {
			Hash common.Hash `json:"h"`
		} `json:"window"`
	}
	if json.Unmarshal(cursor, &cur) != nil || len(cur.Window) == 0 {
		return false
	}
	return cur.Window[len(cur.Window)-1].Hash == h
}

func newDriver(t *testing.T) *ferrypg.Driver[pgx.Tx] {
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	return drv
}

// reorgScenario: blocks 1-3 carry a, b, c; a group at Latest processes
// them; the chain forks at block 1 and the new branch (one block longer)
// carries d, then b and c come back from the mempool, re-mined elsewhere.
// At the end every note has a net effect of exactly one in both groups,
// the Latest group undid b and c once each, and the group at 3
// confirmations never saw the orphaned events.
func reorgScenario(t *testing.T, wrap func(ferrychain.Inbox) ferrychain.Inbox, restarts bool) {
	c := newChain(t)
	drv := newDriver(t)
	latest := newGroup(t, drv, "latest")
	deep := newGroup(t, drv, "deep")
	stopLatest := runSource(t, drv, latest, c, ferrychain.Latest, wrap)
	stopDeep := runSource(t, drv, deep, c, ferrychain.Confirmations(3), nil)
	defer stopLatest()
	defer stopDeep()
	restart := func() {
		if restarts {
			require.NoError(t, stopLatest())
			stopLatest = runSource(t, drv, latest, c, ferrychain.Latest, wrap)
		}
	}

	c.note(0, "a")
	c.commit() // 1
	c.note(0, "b")
	c.commit() // 2
	c.note(0, "c")
	c.commit() // 3
	waitCursor(t, drv, latest, c, 3)
	latest.settle(t)
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, latest.net(t))
	require.Empty(t, deep.net(t), "3 confirmations: nothing is deep enough yet")
	restart()

	orphan2, orphan3 := c.header(2).Hash(), c.header(3).Hash()
	require.NoError(t, c.backend.Fork(c.header(1).Hash()))
	c.note(1, "d")
	c.commit() // 2'
	c.commit() // 3'
	c.commit() // 4': longer, canonical
	require.NotEqual(t, orphan2, c.header(2).Hash(), "the fork did not take")
	c.mineAll() // b and c come back from the mempool
	restart()
	for range 4 {
		c.commit() // deep enough for the 3-confirmation group
	}
	head := c.head()
	waitCursor(t, drv, latest, c, head)
	waitCursor(t, drv, deep, c, head-3)
	latest.settle(t)
	deep.settle(t)

	want := map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}
	require.Equal(t, want, latest.net(t), "net effect per note at Latest")
	require.Equal(t, want, deep.net(t), "net effect per note at 3 confirmations")
	require.Equal(t, 2, latest.count(t, "sign = -1"), "b and c undone once each")
	// b was re-mined into another block (d's transaction first): a new
	// log, processed once, besides the orphaned one that was undone.
	require.Equal(t, 2, latest.count(t, "note = 'b' AND sign = 1"))
	require.Equal(t, 2, latest.count(t, "note = 'b' AND sign = 1 AND log_index = 0")+latest.count(t, "note = 'b' AND sign = 1 AND log_index > 0"))
	require.Equal(t, 1, latest.count(t, "note = 'b' AND sign = 1 AND (block <> 2 OR log_index <> 0)"), "the replacement is at another place (block or log index)")
	var places []string
	rows, err := ferrypgtest.Pool(t).Query(context.Background(), `SELECT format('%s@%s/%s', sign, block, log_index) FROM `+latest.table+` WHERE note = 'b' ORDER BY n`)
	require.NoError(t, err)
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		places = append(places, p)
	}
	t.Logf("b's effects (sign@block/log index), in order: %v", places)
	require.Equal(t, 0, deep.count(t, "sign = -1"), "the deep group never saw the orphaned events")
	for _, orphan := range []common.Hash{orphan2, orphan3} {
		id := ferrychain.LogID(1337, orphan, 0)
		states, err := drv.InboxStates(context.Background(), &ferrydriver.InboxIDsParams{Group: "latest", EventIDs: []uuid.UUID{id}})
		require.NoError(t, err)
		require.Equal(t, ferrydriver.InboxRetracted, states[id].State, "an orphaned block's event is RETRACTED")
		require.Equal(t, 0, deep.count(t, "event_id = $1", id))
	}
	require.NoError(t, stopLatest())
	require.NoError(t, stopDeep())
}

func TestReorgRetractsAndReplaces(t *testing.T) {
	t.Parallel()
	reorgScenario(t, nil, false)
}

func TestReorgWithCleanRestarts(t *testing.T) {
	t.Parallel()
	reorgScenario(t, nil, true)
}

// crashingInbox fails the n-th inbox operation (an Ingest, Retract or
// Lookup), before doing it or after, as a process killed there would: the
// source starts over from its saved cursor.
type crashingInbox struct {
	ferrychain.Inbox
	at    int
	after bool
	calls atomic.Int64
	hit   atomic.Bool
}

var errCrash = errors.New("crash injected")

func (c *crashingInbox) crash(op func() error) error {
	n := int(c.calls.Add(1))
	if n != c.at {
		return op()
	}
	c.hit.Store(true)
	if c.after {
		if err := op(); err != nil {
			return err
		}
	}
	return errCrash
}

func (c *crashingInbox) Ingest(ctx context.Context, events []*ferry.Event) (int, error) {
	var n int
	err := c.crash(func() (err error) { n, err = c.Inbox.Ingest(ctx, events); return err })
	return n, err
}

func (c *crashingInbox) Retract(ctx context.Context, events []*ferry.Event) ([]ferrydriver.InboxState, error) {
	var out []ferrydriver.InboxState
	err := c.crash(func() (err error) { out, err = c.Inbox.Retract(ctx, events); return err })
	return out, err
}

// TestReorgSurvivesACrashAtEveryStep: the scenario with one injected crash
// at each inbox operation in turn, before it and after it; the final state
// is always the same.
func TestReorgSurvivesACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for at := 1; at <= 5; at++ { // a, b, c, the retraction, the new branch's logs
		for _, after := range []bool{false, true} {
			t.Run(fmt.Sprintf("op%d/after=%v", at, after), func(t *testing.T) {
				var last *crashingInbox
				reorgScenario(t, func(in ferrychain.Inbox) ferrychain.Inbox {
					last = &crashingInbox{Inbox: in, at: at, after: after}
					return last
				}, false)
				require.True(t, last.hit.Load(), "the crash at operation %d was never reached", at)
			})
		}
	}
}

// TestWebSocketDropAndResume: the source follows the node over WebSocket
// through a proxy that cuts every connection several times, once for a
// while; each log is still processed exactly once and none is missed.
func TestWebSocketDropAndResume(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	c := newChain(t, func(n *node.Config, _ *ethconfig.Config) {
		n.WSHost, n.WSPort, n.WSModules, n.WSOrigins = "127.0.0.1", port, []string{"eth"}, []string{"*"}
	})
	proxy, err := tcpproxy.Start(fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err)
	defer proxy.Close()
	drv := newDriver(t)
	g := newGroup(t, drv, "ws")
	src, err := ferrychain.New(drv, g.c, &ferrychain.Config{
		Dial:         ferrychain.Dial("ws://" + proxy.Addr()),
		Contracts:    []common.Address{contract},
		Window:       16,
		PollInterval: time.Hour, // only the subscription wakes it: a drop must not go unnoticed
		LeaseTTL:     time.Second,
		Holder:       "ws",
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()

	want := map[string]int{}
	for i := range 30 {
		note := fmt.Sprintf("n%02d", i)
		c.note(0, note)
		want[note] = 1
		c.commit()
		switch i {
		case 8, 15:
			proxy.Reset()
		case 22:
			proxy.Outage(500 * time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
	}
	head := c.head()
	require.Eventually(t, func() bool { return src.Status().Cursor == head }, 30*time.Second, 20*time.Millisecond)
	g.settle(t)
	require.Equal(t, want, g.net(t))
	require.Equal(t, len(want), g.count(t, "sign = 1"), "no log processed twice")
}

// TestDeepReorgHaltsTheGroup: a group at one confirmation has received
// block 2's log when a reorg replaces blocks 2 and 3: deeper than its tier.
// The source raises an alert and halts with ErrDeepReorg, retracting
// nothing; a stalled head raises its own alert.
func TestDeepReorgHaltsTheGroup(t *testing.T) {
	t.Parallel()
	c := newChain(t)
	drv := newDriver(t)
	g := newGroup(t, drv, "one")
	alerts := make(chan *ferrychain.Alert, 10)
	src, err := ferrychain.New(drv, g.c, &ferrychain.Config{
		Dial:         func(context.Context) (ferrychain.Client, error) { return struct{ ferrychain.Client }{c.client}, nil },
		Contracts:    []common.Address{contract},
		Tier:         ferrychain.Confirmations(1),
		Window:       16,
		PollInterval: 20 * time.Millisecond,
		StallAfter:   300 * time.Millisecond,
		LeaseTTL:     time.Second,
		OnAlert:      func(_ context.Context, a *ferrychain.Alert) { alerts <- a },
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- src.Run(context.Background()) }()

	c.note(0, "a")
	c.commit() // 1
	c.note(0, "b")
	c.commit() // 2
	c.commit() // 3: block 2 has one confirmation
	waitCursor(t, drv, g, c, 2)
	select {
	case a := <-alerts:
		require.Equal(t, "head-stalled", a.Kind)
	case <-time.After(10 * time.Second):
		t.Fatal("no alert for a head that stopped moving")
	}

	require.NoError(t, c.backend.Fork(c.header(1).Hash()))
	c.note(1, "d")
	for range 3 {
		c.commit() // 2', 3', 4'
	}
	select {
	case err := <-done:
		require.ErrorIs(t, err, ferrychain.ErrDeepReorg)
		require.ErrorContains(t, err, "RetractAndContinue")
	case <-time.After(20 * time.Second):
		t.Fatal("the source did not halt")
	}
	var deep *ferrychain.Alert
	for deep == nil {
		select {
		case a := <-alerts:
			if a.Kind == "deep-reorg" {
				deep = a
			}
		default:
			t.Fatal("no deep-reorg alert")
		}
	}
	require.EqualValues(t, 1, deep.Depth, "one block the group had passed was orphaned")
	g.settle(t)
	require.Equal(t, 0, g.count(t, "sign = -1"), "halted without retracting")
}

// rangeLimited refuses eth_getLogs ranges wider than max blocks, as many
// providers do.
type rangeLimited struct {
	ferrychain.Client
	max     uint64
	refused atomic.Int64
}

func (r *rangeLimited) FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error) {
	if q.FromBlock != nil && q.ToBlock != nil && q.ToBlock.Uint64()-q.FromBlock.Uint64()+1 > r.max {
		r.refused.Add(1)
		return nil, errors.New("query returned more than 10000 results / block range too large")
	}
	return r.Client.FilterLogs(ctx, q)
}

// TestCatchUpSplitsRefusedRanges: a group starting far behind reads with
// eth_getLogs ranges, halved while the provider refuses them, and then
// block by block; every log arrives once.
func TestCatchUpSplitsRefusedRanges(t *testing.T) {
	t.Parallel()
	c := newChain(t)
	want := map[string]int{}
	for i := range 60 {
		if i%3 == 0 {
			note := fmt.Sprintf("old%02d", i)
			c.note(0, note)
			want[note] = 1
		}
		c.commit()
	}
	drv := newDriver(t)
	g := newGroup(t, drv, "late")
	limited := &rangeLimited{Client: c.client, max: 7}
	src, err := ferrychain.New(drv, g.c, &ferrychain.Config{
		Dial:         func(context.Context) (ferrychain.Client, error) { return limited, nil },
		Contracts:    []common.Address{contract},
		StartBlock:   1,
		Window:       8,
		MaxRange:     40,
		PollInterval: 20 * time.Millisecond,
		LeaseTTL:     time.Second,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() { cancel(); <-done }()
	head := c.head()
	require.Eventually(t, func() bool { return src.Status().Cursor == head }, 30*time.Second, 20*time.Millisecond)
	g.settle(t)
	require.Equal(t, want, g.net(t))
	require.Equal(t, len(want), g.count(t, "sign = 1"))
	require.Positive(t, limited.refused.Load(), "the wide ranges were refused and split")
}
