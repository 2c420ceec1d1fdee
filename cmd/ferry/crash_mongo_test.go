package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// newMongoFixture is a fresh MongoDB database (dropped afterwards) on the
// replica set named by FERRY_TEST_MONGODB_URL, and a fresh stream. Without
// the variable the test skips: no MongoDB server runs on the project's
// machines. With it set, an unreachable server fails the test.
func newMongoFixture(t *testing.T) *fixture {
	raw := os.Getenv("FERRY_TEST_MONGODB_URL")
	if raw == "" {
		t.Skip("set FERRY_TEST_MONGODB_URL to a replica set (mongodb://127.0.0.1:27017/?replicaSet=rs0) to run the MongoDB crash test")
	}
	nc := testNATS(t)
	name := fmt.Sprintf("ferrycrash_%d_%d", time.Now().UnixNano()%1e9, rand.IntN(1e6))
	u, err := url.Parse(raw)
	require.NoError(t, err, "FERRY_TEST_MONGODB_URL")
	u.Path = "/" + name // the relay's database is the URL's path
	dbURL := u.String()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(raw))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	require.NoError(t, client.Ping(ctx, nil), "FERRY_TEST_MONGODB_URL=%s is set but the server does not answer", raw)
	t.Cleanup(func() { _ = client.Database(name).Drop(context.Background()) })
	drv, err := ferrymongo.New(ctx, client, name, nil)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	fc, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)

	f := &fixture{t: t, schema: name, stream: strings.ToUpper(name), prefix: name, store: drv,
		dbArgs: []string{"--database-url", dbURL}}
	f.js, err = jetstream.New(nc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.js.DeleteStream(context.Background(), f.stream) })
	f.emit = func(ctx context.Context, evs []*ferry.Event, hold time.Duration) error {
		sess, err := client.StartSession()
		if err != nil {
			return err
		}
		defer sess.EndSession(context.WithoutCancel(ctx))
		_, err = sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
			if err := fc.EmitTx(sctx, sctx, evs...); err != nil {
				return nil, err
			}
			time.Sleep(hold)
			return nil, nil
		})
		return err
	}
	// No database-side fault: a change stream's cursor cannot be singled
	// out from the producers' sessions without killing those too.
	return f
}
