package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferryui"
)

// defaultUIAddr is where `ferry ui` listens unless told otherwise: this
// machine only.
const defaultUIAddr = "127.0.0.1:9470"

// cmdUI serves the web console and its admin API (ferryui) until ctx ends.
func cmdUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("ui", stderr)
	var db dbFlags
	db.register(f)
	var addr, feed, groups string
	var readOnly bool
	f.String(&addr, "ui-addr", "FERRY_UI_ADDR", defaultUIAddr, "address to serve the console and its API on (another host than loopback exposes it: put it behind your own access control)")
	f.String(&feed, "feed", "FERRY_FEED", "default", "the relay's feed")
	f.String(&groups, "groups", "FERRY_UI_GROUPS", "", "consumer groups to show besides those the database lists, comma-separated")
	f.Bool(&readOnly, "read-only", "FERRY_UI_READ_ONLY", false, "refuse every action (redrive, discard, dead policy)")
	if err := f.Parse(args); err != nil {
		return err
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	ui, err := startUI(b, uiSettings{addr: addr, feed: feed, groups: groups, readOnly: readOnly}, stderr)
	if err != nil {
		return err
	}
	srv := ui.srv
	fmt.Fprintf(stdout, "ferry ui: serving the admin API of %s on %s\n", b.label, ui.url)
	switch {
	case readOnly:
		fmt.Fprintf(stdout, "ferry ui: the console: %s (read-only: actions are refused)\n", ui.console)
	case ui.generated:
		fmt.Fprintf(stdout, "ferry ui: actions need this token (Authorization: Bearer …); set FERRY_UI_TOKEN to choose it: %s\n", ui.token)
		// The fragment stays in the browser: the console keeps the token
		// for its tab and takes it out of the address.
		fmt.Fprintf(stdout, "ferry ui: the console, with the token: %s#token=%s\n", ui.console, ui.token)
	default:
		fmt.Fprintln(stdout, "ferry ui: actions need the token in FERRY_UI_TOKEN (Authorization: Bearer …)")
		fmt.Fprintf(stdout, "ferry ui: the console: %s (paste the token into its header for actions)\n", ui.console)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ui.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// uiSettings are the console's flags.
type uiSettings struct {
	addr, feed, groups string
	readOnly           bool
}

// uiServer is the console's server, listening, not yet serving.
type uiServer struct {
	srv       *http.Server
	ln        net.Listener
	url       string // of the API
	console   string // of the console's page
	token     string
	generated bool // the token was made here (FERRY_UI_TOKEN unset)
}

// startUI makes the console's server on b and listens on its address (the
// caller serves), with the token in FERRY_UI_TOKEN or, unless read-only,
// one generated here. The API's log goes to logs.
func startUI(b *backend, st uiSettings, logs io.Writer) (*uiServer, error) {
	ui := &uiServer{token: os.Getenv("FERRY_UI_TOKEN")}
	if ui.token == "" && !st.readOnly {
		var raw [16]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, err
		}
		ui.token, ui.generated = hex.EncodeToString(raw[:]), true
	}
	cfg := &ferryui.Config{Store: b.store, Feed: st.feed, Token: ui.token, ReadOnly: st.readOnly,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	if b.inbox != nil {
		cfg.Inbox = b.inbox
	}
	for _, g := range strings.Split(st.groups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			cfg.Groups = append(cfg.Groups, g)
		}
	}
	h, err := ferryui.New(cfg)
	if err != nil {
		return nil, err
	}
	ui.ln, err = net.Listen("tcp", st.addr)
	if err != nil {
		return nil, usagef("--ui-addr %s: %v: choose a free address (FERRY_UI_ADDR)", st.addr, err)
	}
	ui.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ui.console = "http://" + ui.ln.Addr().String() + "/"
	ui.url = ui.console + "api/v1/"
	if host, _, _ := net.SplitHostPort(ui.ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(logs, "ferry ui: listening on %s, not only this machine: anyone who can reach it can read events and dead letters\n", ui.ln.Addr())
	}
	return ui, nil
}
