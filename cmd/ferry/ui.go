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
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrychain"
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
	var st uiSettings
	f.String(&st.addr, "ui-addr", "FERRY_UI_ADDR", defaultUIAddr, "address to serve the console and its API on (another host than loopback exposes it: put it behind your own access control)")
	st.register(f)
	f.String(&st.feed, "feed", "FERRY_FEED", "default", "the feed from whose position an event is looked for in the outbox's backlog (the console shows every feed)")
	f.String(&st.groups, "groups", "FERRY_UI_GROUPS", "", "consumer groups to show besides those the database lists, comma-separated")
	f.Bool(&st.readOnly, "read-only", "FERRY_UI_READ_ONLY", false, "refuse every action (redrive, discard, dead policy)")
	f.String(&st.chains, "chain-groups", "FERRY_UI_CHAIN_GROUPS", "", "chain sources to show (the groups of ferry chain run), comma-separated")
	f.String(&st.rpcURL, "rpc-url", "FERRY_CHAIN_RPC_URL", "", "with --chain-groups, the node to read the chain's head from, for each source's lag in blocks")
	if err := f.Parse(args); err != nil {
		return err
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	ui, err := startUI(b, st, stderr)
	if err != nil {
		return err
	}
	srv := ui.srv
	fmt.Fprintf(stdout, "ferry ui: serving the admin API of %s on %s\n", b.label, ui.url)
	for _, line := range ui.says(st) {
		fmt.Fprintln(stdout, "ferry ui: "+line)
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
	hosts              string // names it answers to besides IP addresses and localhost
	openReads          bool   // reads without the token
	chains, rpcURL     string // chain sources shown, and the node their head is read from
}

// register adds the flags `ferry ui` and `ferry run` share: the names the
// console answers to, and whether its reads are open.
func (st *uiSettings) register(f *envFlags) {
	f.String(&st.hosts, "ui-host", "FERRY_UI_HOSTS", st.hosts, "names the console answers to besides IP addresses and localhost, comma-separated "+
		"(host or host:port; * for any, behind a proxy that checks them): a request for another name is refused, as a page that rebinds its name to this machine sends")
	f.Bool(&st.openReads, "open-reads", "FERRY_UI_OPEN_READS", st.openReads, "serve the console's reads (events, payloads, dead letters) without the token; by default they need it, as actions do")
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

// says is what to tell the operator about the token and the console.
func (ui *uiServer) says(st uiSettings) []string {
	what := "actions and reads need"
	switch {
	case st.readOnly && st.openReads:
		return []string{fmt.Sprintf("the console: %s (read-only, reads open: no token)", ui.console)}
	case st.readOnly:
		what = "read-only: actions are refused; reads need"
	case st.openReads:
		what = "reads are open; actions need"
	}
	if ui.generated {
		// The fragment stays in the browser: the console keeps the token
		// for its tab and takes it out of the address.
		return []string{fmt.Sprintf("%s this token (Authorization: Bearer …); set FERRY_UI_TOKEN to choose it: %s", what, ui.token),
			fmt.Sprintf("the console, with the token: %s#token=%s", ui.console, ui.token)}
	}
	return []string{fmt.Sprintf("%s the token in FERRY_UI_TOKEN (Authorization: Bearer …)", what),
		fmt.Sprintf("the console: %s (paste the token into its header)", ui.console)}
}

// startUI makes the console's server on b and listens on its address (the
// caller serves), with the token in FERRY_UI_TOKEN or one generated here
// (none when read-only with open reads). The API's log goes to logs.
func startUI(b *backend, st uiSettings, logs io.Writer) (*uiServer, error) {
	ui := &uiServer{token: os.Getenv("FERRY_UI_TOKEN")}
	if ui.token == "" && !(st.readOnly && st.openReads) {
		var raw [16]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, err
		}
		ui.token, ui.generated = hex.EncodeToString(raw[:]), true
	}
	cfg := &ferryui.Config{Store: b.store, Feed: st.feed, Token: ui.token, ReadOnly: st.readOnly, OpenReads: st.openReads, Hosts: splitList(st.hosts),
		Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	if b.inbox != nil {
		cfg.Inbox = b.inbox
	}
	cfg.Groups = splitList(st.groups)
	cfg.Chains = chainCursors(b, splitList(st.chains), st.rpcURL)
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
		fmt.Fprintf(logs, "ferry ui: listening on %s, not only this machine: anyone who can reach it and has the token can read events and dead letters\n", ui.ln.Addr())
	}
	return ui, nil
}

// splitList reads a comma-separated flag.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// chainCursors reads the saved cursors of the chain sources named (nil:
// none) and, with a node, the chain's head for their lag. A node that does
// not answer is reported with each cursor, not as a failure of the page.
func chainCursors(b *backend, names []string, rpcURL string) func(context.Context) ([]uiapi.ChainJSON, error) {
	if len(names) == 0 {
		return nil
	}
	var mu sync.Mutex
	var node ferrychain.Client
	head := func(ctx context.Context) (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		if node == nil {
			c, err := ferrychain.Dial(rpcURL)(ctx)
			if err != nil {
				return 0, err
			}
			node = c
		}
		h, err := node.HeaderByNumber(ctx, nil)
		if err != nil {
			node = nil // dial again next time
			return 0, err
		}
		return h.Number.Uint64(), nil
	}
	return func(ctx context.Context) ([]uiapi.ChainJSON, error) {
		var at *uint64
		headErr := ""
		if rpcURL != "" {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			n, err := head(hctx)
			cancel()
			if err != nil {
				headErr = "the node at --rpc-url did not answer: " + err.Error()
			} else {
				at = &n
			}
		}
		out := make([]uiapi.ChainJSON, 0, len(names))
		for _, name := range names {
			info, err := ferrychain.ReadCursor(ctx, b.store, name)
			if err != nil {
				return nil, err
			}
			c := uiapi.ChainJSON{Name: info.Name, ChainID: info.ChainID, Tier: info.Tier, Block: info.Block, Hash: info.Hash.Hex(),
				Window: info.Window, Reorgs: info.Reorgs, SavedAt: info.SavedAt, Holder: info.Holder, Held: info.Held, Head: at, HeadError: headErr}
			if at != nil {
				lag := *at - min(*at, info.Block)
				c.LagBlocks = &lag
			}
			out = append(out, c)
		}
		return out, nil
	}
}
