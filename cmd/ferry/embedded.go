package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

var errPortTaken = errors.New("embedded NATS: the port is taken")

// embeddedNATS is a NATS server with JetStream running inside this
// process, listening on loopback only, keeping its streams under dir. It is
// what `ferry run` and `ferry demo` publish to when no NATS URL is given.
type embeddedNATS struct {
	srv     *server.Server
	url     string
	urlFile string
}

// startEmbeddedNATS starts the server; port 0 picks a free port.
func startEmbeddedNATS(dir string, port int) (*embeddedNATS, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded NATS: create its store directory: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else {
		// The server would only log a taken port and never become ready.
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("%w: port %d on 127.0.0.1 (%v)", errPortTaken, port, err)
		}
		_ = ln.Close()
	}
	opts := &server.Options{
		ServerName: "ferry-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   abs,
		NoSigs:     true,
		NoLog:      true,
		// The HTTP monitor, cluster, gateway and leaf ports stay closed.
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not start within 15 s (store %s)", abs)
	}
	e := &embeddedNATS{srv: srv, url: srv.ClientURL(), urlFile: filepath.Join(abs, embeddedURLFile)}
	// The other commands (ferry tail) find it here, whatever port it took.
	if err := os.WriteFile(e.urlFile, []byte(e.url+"\n"), 0o600); err != nil {
		e.Close()
		return nil, fmt.Errorf("embedded NATS: record its URL: %w", err)
	}
	return e, nil
}

// embeddedURLFile, in the embedded server's store directory, holds its
// client URL while it runs.
const embeddedURLFile = "url"

// embeddedURL returns the URL of the embedded NATS server that `ferry run`
// started for dataDir, if one recorded it.
func embeddedURL(dataDir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, "nats", embeddedURLFile))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// Close stops the server and waits for it to flush its store.
func (e *embeddedNATS) Close() {
	_ = os.Remove(e.urlFile)
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
