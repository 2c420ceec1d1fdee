package ferrymongo_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver/ferrymongo"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// mockServer starts testdata/mockserver.py with a scenario: a scripted
// server that answers the real Go driver exactly as a MongoDB server of
// that kind would. It needs Debian's python3-mockupdb (/usr/bin/python3;
// .ci/run installs it); without it the test skips, or fails under CI=true.
func mockServer(t *testing.T, scenario string) string {
	t.Helper()
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import mockupdb").Run(); err != nil {
		msg := "python3-mockupdb is not installed (apt-get install python3-mockupdb): " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cmd := exec.Command(py, "testdata/mockserver.py", scenario)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the mock server did not start")
	return strings.TrimSpace(line)
}

func mockClient(t *testing.T, uri string) *mongo.Client {
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetDirect(true).SetServerSelectionTimeout(5 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() {
		// The scripted server does not answer everything a disconnect
		// sends: do not wait for it.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return client
}

// A standalone server cannot run change streams or transactions: New
// refuses it at once and says how to make it a replica set.
func TestMockStandaloneIsRefusedWithTheFix(t *testing.T) {
	client := mockClient(t, mockServer(t, "standalone"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := ferrymongo.New(ctx, client, "app", nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "--replSet")
	require.Contains(t, err.Error(), "rs.initiate()")
}

// mongos (a sharded cluster) is accepted.
func TestMockMongosIsAccepted(t *testing.T) {
	client := mockClient(t, mockServer(t, "mongos"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := ferrymongo.New(ctx, client, "app", nil)
	require.NoError(t, err)
}
