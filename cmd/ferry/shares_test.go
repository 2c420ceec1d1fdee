package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryshared/childtest"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The consumer processes of the share tests: three replicas of a
// consuming service, each running Consume on the same source and Run on
// the same group, recording who ingested what.

const (
	// shareCount is the sink's and the source's shares (Kafka: the
	// topic's partitions).
	shareCount = 6
	// shareTTL is the children's ConsumerConfig.SourceLeaseTTL and their
	// Kafka session timeout: a dead replica's shares move within two.
	shareTTL = 3 * time.Second
)

// sharesChild runs one replica (spec: <schema>|nats|<stream>|<prefix> or
// <schema>|kafka|<brokers>|<topic>) until SIGTERM.
func sharesChild(spec string) int {
	parts := strings.Split(spec, "|")
	schema, broker, a, b := parts[0], parts[1], parts[2], parts[3]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	childtest.SignalReady()
	var src ferrysink.Source
	switch broker {
	case "nats":
		js, closeNATS, err := childJetStream()
		if err != nil {
			return childFailed(err)
		}
		defer closeNATS()
		s, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: a, SubjectPrefix: b, Durable: "billing", Shares: shareCount, AckWait: time.Second, Batch: 50})
		if err != nil {
			return childFailed(err)
		}
		src = s
	case "kafka":
		s, err := ferrykafka.NewSource(ctx, &ferrykafka.SourceConfig{Brokers: strings.Split(a, ","), Group: "billing", Topics: []string{b}, Batch: 50,
			ClientOptions: []kgo.Opt{kgo.SessionTimeout(shareTTL), kgo.HeartbeatInterval(shareTTL / 10)}})
		if err != nil {
			return childFailed(err)
		}
		src = s
	}
	r, err := openReplica(ctx, schema, &ferry.ConsumerConfig{Group: "billing", SourceLeaseTTL: shareTTL, PollInterval: 20 * time.Millisecond})
	if err != nil {
		return childFailed(err)
	}
	ingests := pgx.Identifier{schema, "ingests"}.Sanitize()
	pid := os.Getpid()
	record := func(ctx context.Context, evs []*ferry.Event) {
		ids, keys := make([]string, len(evs)), make([]string, len(evs))
		for i, ev := range evs {
			ids[i], keys[i] = ev.ID.String(), ev.Key
		}
		_, _ = r.pool.Exec(ctx, `INSERT INTO `+ingests+` (event_id, key, pid) SELECT id, k, $3 FROM unnest($1::uuid[], $2::text[]) AS u(id, k)`, ids, keys, pid)
	}
	return r.run(ctx, stop, recorded(src, record))
}

// recorded wraps src so that record sees what each ingest accepted,
// keeping src's shares.
func recorded(src ferrysink.Source, record func(context.Context, []*ferry.Event)) ferrysink.Source {
	wrap := func(ingest func(context.Context, []*ferry.Event) error) func(context.Context, []*ferry.Event) error {
		return func(ctx context.Context, evs []*ferry.Event) error {
			if err := ingest(ctx, evs); err != nil {
				return err
			}
			record(ctx, evs)
			return nil
		}
	}
	r := recordingSource{src: src, wrap: wrap}
	if sh, ok := src.(ferrysink.Shared); ok {
		return recordingShared{recordingSource: r, sh: sh}
	}
	return r
}

type recordingSource struct {
	src  ferrysink.Source
	wrap func(func(context.Context, []*ferry.Event) error) func(context.Context, []*ferry.Event) error
}

func (r recordingSource) Run(ctx context.Context, ingest func(context.Context, []*ferry.Event) error) error {
	return r.src.Run(ctx, r.wrap(ingest))
}

type recordingShared struct {
	recordingSource
	sh ferrysink.Shared
}

func (r recordingShared) ReaderName() string { return r.sh.ReaderName() }
func (r recordingShared) Shares() int        { return r.sh.Shares() }
func (r recordingShared) RunShare(ctx context.Context, i int, ingest func(context.Context, []*ferry.Event) error) error {
	return r.sh.RunShare(ctx, i, r.wrap(ingest))
}

// TestConsumerSharesOverReplicasJetStream: three replicas of a consuming
// service on one JetStream source of six shares each ingest about a
// third; one SIGKILLed has its shares ingested by the others within two
// lease TTLs; every event is applied once, each key in order.
func TestConsumerSharesOverReplicasJetStream(t *testing.T) {
	t.Parallel()
	testShares(t, "nats")
}

// TestConsumerSharesOverReplicasKafka: the same on Kafka (kfake), where
// the consumer group spreads the topic's six partitions and the session
// timeout plays the lease's part.
func TestConsumerSharesOverReplicasKafka(t *testing.T) {
	t.Parallel()
	testShares(t, "kafka")
}

func testShares(t *testing.T, broker string) {
	ctx := context.Background()
	st := newReplicaStore(t, `ingests (event_id uuid NOT NULL, key text NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	pool, drv, schema, effects, count := st.pool, st.drv, st.schema, st.effects, st.count
	ingests := pgx.Identifier{schema, "ingests"}.Sanitize()

	var sink ferrysink.Sink
	var spec string
	var balanced func(pids []int) bool // each replica reads shareCount/3 shares
	switch broker {
	case "nats":
		nc := testNATS(t)
		stream, prefix := strings.ToUpper(schema), schema
		s, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true, Shares: shareCount})
		require.NoError(t, err)
		sink = s
		t.Cleanup(func() {
			if js, err := jetstream.New(nc); err == nil {
				_ = js.DeleteStream(context.Background(), stream)
			}
		})
		spec = schema + "|nats|" + stream + "|" + prefix
		balanced = func(pids []int) bool {
			held := map[int]int{}
			for i := range shareCount {
				l, err := drv.GetLease(ctx, fmt.Sprintf("consumer-sources/nats/%s/billing/%d", stream, i))
				if err != nil || !l.ExpiresAt.After(l.Now) {
					return false
				}
				for _, pid := range pids {
					if strings.Contains(l.Holder, fmt.Sprintf("-%d-", pid)) {
						held[pid]++
					}
				}
			}
			return len(held) == len(pids) && !hasOtherThan(held, shareCount/len(pids))
		}
	case "kafka":
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(shareCount, "orders"), kfake.GroupMinSessionTimeout(time.Second))
		require.NoError(t, err)
		t.Cleanup(c.Close)
		brokers := c.ListenAddrs()
		s, err := ferrykafka.New(ctx, &ferrykafka.Config{Brokers: brokers})
		require.NoError(t, err)
		sink = s
		spec = schema + "|kafka|" + strings.Join(brokers, ",") + "|orders"
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		adm := kadm.NewClient(cl)
		balanced = func(pids []int) bool {
			groups, err := adm.DescribeGroups(ctx, "billing")
			if err != nil {
				return false
			}
			g := groups["billing"]
			if g.State != "Stable" || len(g.Members) != len(pids) {
				return false
			}
			for _, m := range g.Members {
				a, ok := m.Assigned.AsConsumer()
				if !ok {
					return false
				}
				n := 0
				for _, tp := range a.Topics {
					n += len(tp.Partitions)
				}
				if n != shareCount/len(pids) {
					return false
				}
			}
			return true
		}
	}
	t.Cleanup(func() { _ = sink.Close(context.Background()) })

	const keys, chunk = 60, 30
	var seq [keys]int64
	var sent atomic.Int64
	publish := func(n int) {
		evs := make([]*ferry.Event, n)
		for i := range evs {
			k := int(sent.Load()+int64(i)) % keys
			seq[k]++
			evs[i] = &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: fmt.Sprintf("k%d", k), Type: "OrderPlaced", Seq: seq[k], Payload: []byte(`{}`), CreatedAt: time.Now()}
		}
		for _, err := range sink.Publish(ctx, evs) {
			require.NoError(t, err)
		}
		sent.Add(int64(n))
	}
	// publishFor publishes a chunk every 50 ms for d.
	publishFor := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			publish(chunk)
			time.Sleep(50 * time.Millisecond)
		}
	}

	env := "FERRY_TEST_SHARES_CHILD=" + spec
	kids := []*childProc{}
	for range 3 {
		kids = append(kids, &childProc{cmd: childtest.Start(t, env)})
	}
	pids := func(kids []*childProc) []int {
		var out []int
		for _, k := range kids {
			out = append(out, k.cmd.Process.Pid)
		}
		return out
	}
	publish(chunk)
	require.Eventually(t, func() bool { return balanced(pids(kids)) }, 2*time.Minute, 20*time.Millisecond, "three replicas read %d shares each", shareCount/3)

	// Steady: each replica ingests the keys of its shares, about a third.
	var from time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&from))
	publishFor(3 * time.Second)
	require.Eventually(t, func() bool { return count(`SELECT count(DISTINCT event_id) FROM `+ingests) >= int(sent.Load()) }, time.Minute, 20*time.Millisecond)
	steady := count(`SELECT count(*) FROM `+ingests+` WHERE at > $1`, from)
	for _, k := range kids {
		k.ingested = count(`SELECT count(*) FROM `+ingests+` WHERE at > $1 AND pid = $2`, from, k.cmd.Process.Pid)
		k.keys = count(`SELECT count(DISTINCT key) FROM `+ingests+` WHERE at > $1 AND pid = $2`, from, k.cmd.Process.Pid)
	}
	t.Logf("%s: ingested by each replica while three ran: %d, %d, %d of %d (keys %d, %d, %d of %d)", broker,
		kids[0].ingested, kids[1].ingested, kids[2].ingested, steady, kids[0].keys, kids[1].keys, kids[2].keys, keys)
	for _, k := range kids {
		require.Greater(t, k.ingested, steady/6, "a replica ingests about a third")
		require.Less(t, k.ingested, steady/2+1, "a replica ingests about a third")
	}
	require.Zero(t, count(`SELECT count(*) FROM (SELECT key FROM `+ingests+` WHERE at > $1 GROUP BY key HAVING count(DISTINCT pid) > 1) k`, from),
		"a key is ingested by one replica while the shares stay put")

	// A replica dies: its keys are ingested by the others within two TTLs.
	dead := kids[0]
	published := make(chan struct{})
	go func() {
		defer close(published)
		publishFor(4 * shareTTL)
	}()
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, dead.cmd.Process.Signal(syscall.SIGKILL))
	var killedAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killedAt))
	_ = dead.cmd.Wait()
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM `+ingests+` WHERE at > $1 AND pid <> $2 AND key IN (SELECT key FROM `+ingests+` WHERE at > $3 AND at < $1 AND pid = $2)`,
			killedAt, dead.cmd.Process.Pid, from) > 0
	}, time.Minute, 10*time.Millisecond, "the dead replica's keys are ingested again")
	var moved float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXTRACT(EPOCH FROM min(at) - $1::timestamptz)::float8 FROM `+ingests+` WHERE at > $1 AND pid <> $2 AND key IN (SELECT key FROM `+ingests+` WHERE at > $3 AND at < $1 AND pid = $2)`,
		killedAt, dead.cmd.Process.Pid, from).Scan(&moved))
	<-published
	require.Eventually(t, func() bool { return balanced(pids(kids[1:])) }, time.Minute, 20*time.Millisecond, "two replicas read %d shares each", shareCount/2)
	require.Eventually(t, func() bool { return count(`SELECT count(DISTINCT event_id) FROM `+effects) >= int(sent.Load()) }, 2*time.Minute, 20*time.Millisecond)
	for _, k := range kids[1:] {
		require.NoError(t, k.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, k.cmd.Wait())
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%s: the SIGKILLed replica's keys were ingested by another %.3fs after the SIGKILL (TTL %v; load average %s)", broker, moved, shareTTL, strings.TrimSpace(string(load)))

	st.requireOnceInOrder(int(sent.Load()))
	require.Less(t, moved, (2 * shareTTL).Seconds(), "the dead replica's shares moved past two TTLs")
}

// childProc is a replica of the share tests.
type childProc struct {
	cmd            *exec.Cmd
	ingested, keys int
}

// hasOtherThan says whether a count in m differs from n.
func hasOtherThan(m map[int]int, n int) bool {
	for _, v := range m {
		if v != n {
			return true
		}
	}
	return false
}
