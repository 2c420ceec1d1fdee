package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// The crash and zombie tests run the real `ferry relay` as a child process
// and kill or pause it. FERRY_CRASH_LONG=1 (make test/crash-long) runs the
// longer variant.

var ferryBin string

func TestMain(m *testing.M) {
	if spec := os.Getenv("FERRY_TEST_SOURCE_CHILD"); spec != "" {
		os.Exit(sourceChild(spec)) // a consumer process of TestOneReaderPerDurable
	}
	if spec := os.Getenv("FERRY_TEST_SHARES_CHILD"); spec != "" {
		os.Exit(sharesChild(spec)) // a replica of TestConsumerSharesOverReplicas*
	}
	dir, err := os.MkdirTemp("", "ferry-bin-")
	if err != nil {
		panic(err)
	}
	ferryBin = filepath.Join(dir, "ferry")
	out, err := exec.Command("go", "build", "-race", "-o", ferryBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build ferry for the tests: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func natsURL() string {
	if u := os.Getenv("FERRY_TEST_NATS_URL"); u != "" {
		return u
	}
	return nats.DefaultURL
}

func testNATS(t *testing.T) *nats.Conn {
	nc, err := nats.Connect(natsURL(), nats.Timeout(2*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS", "FERRY_TEST_NATS_URL", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// fixture is one isolated schema (or MongoDB database) and stream.
type fixture struct {
	t              *testing.T
	schema, stream string
	prefix         string
	drv            *ferrypg.Driver[pgx.Tx] // PostgreSQL fixtures only
	client         *ferry.Client[pgx.Tx]   // PostgreSQL fixtures only
	js             jetstream.JetStream

	// The backend seen by the crash and zombie tests.
	store  ferrydriver.Store
	dbArgs []string // `ferry relay` flags naming the database
	// emit stores evs in one transaction that stays open for hold after
	// emitting (a late committer when hold > 0).
	emit func(ctx context.Context, evs []*ferry.Event, hold time.Duration) error
	// terminateFeed ends the relay's feed session from the database side;
	// nil where the backend offers no way to single it out.
	terminateFeed func(ctx context.Context)

	// The destination: JetStream unless a test swaps it (useKafka).
	sinkArgs  []string // `ferry relay` flags naming it
	env       []string // extra variables of the relay child
	relayArgs []string // extra flags of every relay child

	// A crash test with stuck keys: stuck emits events that the
	// destination refuses while the relay is killed (stuckKeys keys of
	// them), unstick lets them through once the kills are over.
	stuck     func(ctx context.Context) []*ferry.Event
	unstick   func()
	stuckKeys int
	filler    uint64                                  // messages in the stream that are not events
	read      func(ctx context.Context) []ferry.Event // everything stored, in order per key
	dedup     bool                                    // the destination drops republished event IDs
	// count, where set, is the number of messages stored, copies
	// included: a cheap bound that spares waitStored a full read back
	// while the destination cannot yet hold every event.
	count func(ctx context.Context) int64
}

// storedWithin bounds how long a test waits for the destination to hold
// every event. It is a liveness bound, not a speed target: on a loaded CI
// machine a drain of 20,000 events with every look reading the topic back
// has taken close to 3 min.
const storedWithin = 4 * time.Minute

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, 1) }

// newFixtureWith is newFixture with an outbox of the given partitions.
func newFixtureWith(t *testing.T, partitions int) *fixture {
	nc := testNATS(t)
	pool := ferrypgtest.Pool(t)
	f := &fixture{t: t, schema: ferrypgtest.Schema(t)}
	f.stream = strings.ToUpper(f.schema)
	f.prefix = f.schema
	var err error
	f.drv, err = ferrypg.New(pool, &ferrypg.Config{Schema: f.schema, Partitions: partitions})
	require.NoError(t, err)
	_, err = f.drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	f.client, err = ferry.NewClient(f.drv, nil)
	require.NoError(t, err)
	f.js, err = jetstream.New(nc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.js.DeleteStream(context.Background(), f.stream) })
	f.useJetStream()
	f.store = f.drv
	f.dbArgs = []string{"--database-url", ferrypgtest.URL(), "--schema", f.schema, "--partitions", strconv.Itoa(partitions)}
	f.emit = func(ctx context.Context, evs []*ferry.Event, hold time.Duration) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT pg_current_xact_id()") // a business write would take an xid first
			if err != nil {
				return err
			}
			if err := f.client.EmitTx(ctx, tx, evs...); err != nil {
				return err
			}
			time.Sleep(hold)
			return nil
		})
	}
	f.terminateFeed = func(ctx context.Context) {
		_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = left($1, 63)`,
			"ferry feed "+f.schema+" default/0")
		require.NoError(t, err)
	}
	return f
}

// useJetStream makes the fixture's stream the relay's destination.
func (f *fixture) useJetStream() {
	f.sinkArgs = []string{"--nats-url", natsURL(), "--stream", f.stream, "--subject-prefix", f.prefix, "--create-stream"}
	f.read, f.dedup = f.readStream, true
}

// child is one `ferry relay` process.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	logs *lineLog
}

type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (f *fixture) startRelay(holder string, extra ...string) *child {
	return f.start("relay", holder, extra...)
}

// start runs `ferry <command>` (relay or run) on the fixture.
func (f *fixture) start(command, holder string, extra ...string) *child {
	args := append([]string{command}, f.dbArgs...)
	args = append(append(append(args, f.sinkArgs...),
		"--holder", holder, "--lease-ttl", "2s", "--poll-interval", "50ms", "--batch", strconv.Itoa(crashBatch),
		"--metrics-addr", "", "--log-level", "debug"), append(f.relayArgs, extra...)...)
	cmd := exec.Command(ferryBin, args...)
	cmd.Env = append(os.Environ(), f.env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(f.t, err)
	require.NoError(f.t, cmd.Start())
	c := &child{cmd: cmd, done: make(chan struct{}), logs: &lineLog{}}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.logs.mu.Lock()
			c.logs.lines = append(c.logs.lines, sc.Text())
			c.logs.mu.Unlock()
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	f.t.Cleanup(func() {
		c.kill()
		if f.t.Failed() {
			// What the child logged last explains most failures.
			lines := c.logs.all()
			f.t.Logf("ferry %s --holder %s logged %d lines; the last ones:\n%s", command, holder, len(lines), strings.Join(lines[max(0, len(lines)-failedLogLines):], "\n"))
		}
	})
	return c
}

// failedLogLines is how much of a child's log a failed test prints.
const failedLogLines = 60

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.cmd.Process.Kill()
	<-c.done
}

func (c *child) stop(t *testing.T) {
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop within 30s of SIGTERM")
	}
}

// duplicates sums the duplicates the broker reported dropping, from logs.
// led reports whether the relay became the leader.
func (c *child) led() bool {
	for _, l := range c.logs.all() {
		if strings.Contains(l, "relay is the leader") {
			return true
		}
	}
	return false
}

// awaitLeader waits until the relay leads (the previous one's lease must
// expire first), so that a kill always hits a working leader.
func (c *child) awaitLeader(t *testing.T, within time.Duration) {
	t.Helper()
	require.Eventually(t, c.led, within, 10*time.Millisecond, "the relay never became the leader")
}

// epochs splits the relay's duplicate reports by leadership: a relay that
// loses its feed session or its lease starts again from its saved checkpoint,
// so each "relay is the leader" begins a new redelivery window. For each epoch
// it returns the duplicates the destination dropped and the events the relay
// itself re-sent after a failed publish (those may have landed the first time).
func (c *child) epochs() (dups, retried []int) {
	for _, l := range c.logs.all() {
		var rec struct {
			Count  int
			Events int
		}
		switch {
		case strings.Contains(l, "relay is the leader"):
			dups, retried = append(dups, 0), append(retried, 0)
		case len(dups) == 0:
		case strings.Contains(l, "destination dropped duplicates"):
			if json.Unmarshal([]byte(l), &rec) == nil {
				dups[len(dups)-1] += rec.Count
			}
		case strings.Contains(l, "publish failed; retrying"):
			if json.Unmarshal([]byte(l), &rec) == nil {
				retried[len(retried)-1] += rec.Events
			}
		}
	}
	return dups, retried
}

// produce emits n events over keys with writers goroutines, pacing to rate
// events/s, and returns them.
//
// One transaction in 50 stays open for up to a second after emitting, so
// that late committers (lower ids committing after higher ones) are common.
func (f *fixture) produce(ctx context.Context, n, keys, writers, rate int) []*ferry.Event {
	var mu sync.Mutex
	var all []*ferry.Event
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for {
				k := 1 + rng.IntN(4)
				first := int(next.Add(int64(k))) - k
				if first >= n {
					return
				}
				k = min(k, n-first)
				if due := start.Add(time.Duration(first) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
					time.Sleep(time.Until(due))
				}
				evs := make([]*ferry.Event, k)
				for j := range evs {
					evs[j] = &ferry.Event{Topic: "orders", Key: "customer-" + strconv.Itoa(rng.IntN(keys)), Type: "OrderPlaced",
						Payload: []byte(fmt.Sprintf(`{"n":%d}`, first+j))}
				}
				var hold time.Duration
				if rng.IntN(50) == 0 {
					hold = time.Duration(rng.IntN(1000)) * time.Millisecond
				}
				err := f.emit(ctx, evs, hold)
				if err != nil {
					f.t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, evs...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return all
}

// readStream returns every message stored in the fixture's stream, in order.
func (f *fixture) readStream(ctx context.Context) []ferry.Event {
	s, err := f.js.Stream(ctx, f.stream)
	require.NoError(f.t, err)
	info, err := s.Info(ctx)
	require.NoError(f.t, err)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(f.t, err)
	var out []ferry.Event
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		require.NoError(f.t, err)
		for msg := range batch.Messages() {
			read++
			if msg.Headers().Get("Prefill") != "" {
				continue // a test's filler, not an event
			}
			ev, err := ferrynats.DecodeJetStream(msg)
			require.NoError(f.t, err)
			out = append(out, ev)
		}
		require.NoError(f.t, batch.Error())
	}
	return out
}

// waitStored waits until the destination holds at least n distinct events.
func (f *fixture) waitStored(ctx context.Context, n int, within time.Duration) {
	deadline := time.Now().Add(within)
	for {
		if f.dedup {
			s, err := f.js.Stream(ctx, f.stream)
			if err == nil {
				info, err := s.Info(ctx)
				if err == nil && info.State.Msgs >= uint64(n)+f.filler {
					return
				}
			}
		} else if f.count == nil || f.count(ctx) >= int64(n) {
			ids := map[string]bool{}
			for _, e := range f.read(ctx) {
				ids[e.ID.String()] = true
			}
			if len(ids) >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the destination did not reach %d events within %v", n, within)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// verify checks the stream against what was emitted: nothing missing,
// nothing stored twice, each key in Seq order without gaps.
func (f *fixture) verify(emitted []*ferry.Event, stored []ferry.Event) {
	t := f.t
	want := make(map[string]bool, len(emitted))
	for _, e := range emitted {
		want[e.ID.String()] = true
	}
	seen := make(map[string]bool, len(stored))
	lastSeq := map[string]int64{}
	dups, unknown := 0, 0
	for _, e := range stored {
		id := e.ID.String()
		if seen[id] {
			dups++
			if !f.dedup {
				continue // a republished copy; consumers drop it by ID
			}
		}
		seen[id] = true
		if !want[id] {
			unknown++
		}
		require.Equal(t, lastSeq[e.Key]+1, e.Seq, "key %s: stored Seq %d after %d (order violation or gap)", e.Key, e.Seq, lastSeq[e.Key])
		lastSeq[e.Key] = e.Seq
	}
	missing := 0
	for id := range want {
		if !seen[id] {
			missing++
		}
	}
	require.Zero(t, missing, "events emitted but never stored")
	if f.dedup {
		require.Zero(t, dups, "events stored twice")
	}
	require.Zero(t, unknown, "events stored that were never emitted")
}

const crashBatch = 200

// TestRelayCrash SIGKILLs the relay at random moments while producers emit.
func TestRelayCrash(t *testing.T) {
	t.Parallel()
	relayCrash(t, newFixture(t))
}

// TestRelayCrashMongo is TestRelayCrash on MongoDB (FERRY_TEST_MONGODB_URL).
func TestRelayCrashMongo(t *testing.T) {
	t.Parallel()
	relayCrash(t, newMongoFixture(t))
}

// relayCrash runs the crash test on f and returns the relays it ran.
func relayCrash(t *testing.T, f *fixture) []*child {
	events, keys, kills := 20000, 500, 20
	if os.Getenv("FERRY_CRASH_LONG") != "" {
		events, kills = 100000, 100
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	rate := events / 10 // spread the production over ~10 s of kills
	var emitted, stuck []*ferry.Event
	produced, stuckDone := make(chan struct{}), make(chan struct{})
	go func() { emitted = f.produce(ctx, events, keys, 8, rate); close(produced) }()
	go func() {
		defer close(stuckDone)
		if f.stuck != nil {
			stuck = f.stuck(ctx)
		}
	}()

	rng := rand.New(rand.NewPCG(1, 2))
	var lifetimes []*child
	relay := f.startRelay("crash")
	for k := 0; k < kills; k++ {
		relay.awaitLeader(t, 30*time.Second)
		time.Sleep(time.Duration(150+rng.IntN(500)) * time.Millisecond)
		if k%5 == 2 && f.terminateFeed != nil {
			// A database-side fault instead: the relay's feed session is
			// terminated under it and it must reconnect by itself.
			f.terminateFeed(ctx)
			time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		}
		relay.kill()
		lifetimes = append(lifetimes, relay)
		relay = f.startRelay("crash")
	}
	<-produced
	<-stuckDone
	require.False(t, t.Failed())
	emitted = append(emitted, stuck...)
	if f.unstick != nil {
		f.unstick()
	}
	// A liveness bound, not a measurement: reading a Kafka destination
	// back is O(events) per look, and CI shares two cores.
	f.waitStored(ctx, len(emitted), storedWithin)
	// The last relay may find everything published by the one killed
	// before it; it must still take over before it is stopped.
	relay.awaitLeader(t, 30*time.Second)
	relay.stop(t)
	lifetimes = append(lifetimes, relay)

	stored := f.read(ctx)
	f.verify(emitted, stored)
	// A killed relay republishes what it published after its last saved
	// checkpoint: the relay takes a batch only while less than a batch is
	// unacknowledged and less than two batches lie past that checkpoint, so
	// at most two batches. A new leader's batches are cut from a newer
	// snapshot than its predecessor's, though: late committers that became
	// visible in between take room in them, and a few of the predecessor's
	// unsaved events can fall past the next saved checkpoint and be redelivered
	// by the leader after. The allowance for that is a tenth of a batch; the
	// events a relay re-sent itself after a failed publish are added on top.
	// A parked key's head may have reached the destination before a kill
	// and is published again from the store: one more per stuck key.
	window := 2*crashBatch + crashBatch/10 + f.stuckKeys
	maxDup, total, epochs, resent := 0, 0, 0, 0
	for i, c := range lifetimes {
		dups, retried := c.epochs()
		for j := range dups {
			epochs++
			resent += retried[j]
			total += dups[j]
			maxDup = max(maxDup, dups[j])
			require.LessOrEqual(t, dups[j], window+retried[j],
				"relay %d, leadership %d: %d redelivered (%d re-sent after failed publishes) exceed the in-flight window", i, j, dups[j], retried[j])
		}
	}
	t.Logf("%d events, %d keys, %d SIGKILLs, %d leaderships: %d stored, %d redelivered in all (max %d in one leadership, bound %d)",
		len(emitted), keys, kills, epochs, len(stored), total, maxDup, window)
	if !f.dedup {
		// The destination keeps every copy: count them from what it stored.
		copies := len(stored) - len(emitted)
		t.Logf("%d copies stored in all (bound %d leaderships x %d + %d re-sent after failed publishes)", copies, epochs, window, resent)
		require.LessOrEqual(t, copies, epochs*window+resent, "republished copies exceed the in-flight window of each leadership")
	}
	for i, c := range lifetimes {
		require.True(t, c.led(), "relay %d was killed without having led: the kill tested nothing", i)
	}
	return lifetimes
}

// TestZombieLeader pauses the leading relay past its lease TTL, lets a
// standby take over, resumes the old leader and checks that it cannot save
// a checkpoint (every checkpoint write carries the term).
func TestZombieLeader(t *testing.T) {
	t.Parallel()
	zombieLeader(t, newFixture(t))
}

// TestZombieLeaderMongo is TestZombieLeader on MongoDB (FERRY_TEST_MONGODB_URL).
func TestZombieLeaderMongo(t *testing.T) {
	t.Parallel()
	zombieLeader(t, newMongoFixture(t))
}

func zombieLeader(t *testing.T, f *fixture) {
	ctx, cancel := context.WithTimeout(context.Background(), storedWithin+2*time.Minute)
	defer cancel()
	a := f.startRelay("a")
	require.Eventually(t, func() bool {
		l, err := f.store.GetLease(ctx, "default/0")
		return err == nil && heldBy(l, "a")
	}, 20*time.Second, 50*time.Millisecond, "a becomes the leader")
	b := f.startRelay("b")

	var emitted []*ferry.Event
	produced := make(chan struct{})
	go func() { emitted = f.produce(ctx, 4000, 50, 4, 800); close(produced) }()
	time.Sleep(1500 * time.Millisecond)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	paused := time.Now()
	require.Eventually(t, func() bool {
		l, err := f.store.GetLease(ctx, "default/0")
		return err == nil && heldBy(l, "b")
	}, 20*time.Second, 50*time.Millisecond, "b takes over while a is paused")
	t.Logf("b took over %v after a was paused", time.Since(paused).Round(time.Millisecond))
	lb, err := f.store.GetLease(ctx, "default/0")
	require.NoError(t, err)
	require.Greater(t, lb.Term, int64(1))
	require.Eventually(t, func() bool {
		cp, err := f.store.LoadCheckpoint(ctx, "default/0")
		return err == nil && cp.Term == lb.Term
	}, 20*time.Second, 20*time.Millisecond, "b saves a checkpoint")
	time.Sleep(time.Until(paused.Add(4 * time.Second))) // a stays paused for twice its TTL
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))

	// For the next seconds the checkpoint must only ever carry b's term.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		cp, err := f.store.LoadCheckpoint(ctx, "default/0")
		require.NoError(t, err)
		require.Equal(t, lb.Term, cp.Term, "a checkpoint was written at an old term after the leader changed")
		time.Sleep(20 * time.Millisecond)
	}
	<-produced
	f.waitStored(ctx, len(emitted), storedWithin)
	a.stop(t) // a first: stopping b releases the lease, which a would take
	b.stop(t)
	f.verify(emitted, f.read(ctx))
	cp, err := f.store.LoadCheckpoint(ctx, "default/0")
	require.NoError(t, err)
	require.Equal(t, lb.Term, cp.Term, "the final checkpoint is b's")
	lost := false
	for _, l := range a.logs.all() {
		if strings.Contains(l, "lost its lease") {
			lost = true
		}
	}
	require.True(t, lost, "the resumed relay must notice it lost the lease; its log:\n%s", strings.Join(a.logs.all(), "\n"))
}

// heldBy reports whether l is held, and by a run of the relay named name
// (each run holds the lease as "<name>#<random>").
func heldBy(l *ferrydriver.Lease, name string) bool {
	return l != nil && strings.HasPrefix(l.Holder, name+"#") && l.Held(l.Holder)
}

// TestRelayCrashWhileKeysAreStuck is TestRelayCrash while five keys' subject
// is at its limit in JetStream: the relay parks them, is killed 20 times
// meanwhile, and the bound on redeliveries still holds (plus one head per
// parked key); once the limit is raised they are stored, in order.
func TestRelayCrashWhileKeysAreStuck(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	const limit = 25000
	_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: f.stream, Subjects: []string{f.prefix + ".>"}, Duplicates: 2 * time.Minute,
		MaxMsgsPerSubject: limit, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
	})
	require.NoError(t, err)
	for i := 0; i < limit; {
		_, err := f.js.PublishMsgAsync(&nats.Msg{Subject: f.prefix + ".full", Header: nats.Header{"Prefill": []string{strconv.Itoa(i)}}})
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// The client's window of unacknowledged publishes is full (a
			// busy machine): wait for it to drain, then go on.
			select {
			case <-f.js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				t.Fatal("prefilling the stream stalled for a minute")
			}
			continue
		}
		require.NoError(t, err)
		i++
	}
	select {
	case <-f.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("prefilling the stream took over a minute")
	}
	f.filler = limit
	f.relayArgs = []string{"--stall-timeout", "300ms"}
	f.stuckKeys = 5
	f.stuck = func(ctx context.Context) []*ferry.Event {
		var out []*ferry.Event
		for i := range 250 {
			ev := &ferry.Event{Topic: "full", Key: "stuck-" + strconv.Itoa(i%f.stuckKeys), Type: "T", Payload: []byte(strconv.Itoa(i))}
			if err := f.emit(ctx, []*ferry.Event{ev}, 0); err != nil {
				t.Error(err)
				return out
			}
			out = append(out, ev)
			time.Sleep(40 * time.Millisecond)
		}
		return out
	}
	f.unstick = func() {
		s, err := f.js.Stream(ctx, f.stream)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		cfg := info.Config
		cfg.MaxMsgsPerSubject = 2 * limit
		_, err = f.js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	parked := 0
	for _, c := range relayCrash(t, f) {
		for _, l := range c.logs.all() {
			if strings.Contains(l, "key parked") || strings.Contains(l, "resuming parked keys") {
				parked++
			}
		}
	}
	t.Logf("%d parkings and resumptions of parked keys across the relays", parked)
	require.NotZero(t, parked, "the stuck keys were parked")
}
