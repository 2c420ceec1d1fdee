package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// chromiumPath is the browser the console tests drive: Debian's chromium
// (.ci/run installs it), or FERRY_TEST_CHROMIUM.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("FERRY_TEST_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium: apt-get install chromium, or set FERRY_TEST_CHROMIUM to a Chromium binary")
	}
	t.Skip("no chromium: apt-get install chromium, or set FERRY_TEST_CHROMIUM to a Chromium binary")
	return ""
}

// browser starts a headless Chromium with a fresh profile; any JavaScript
// dialog (an alert a hostile value would open) fails the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank"))) // starts the browser
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		switch d := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			t.Errorf("the page opened a %s dialog: %q (a value ran as script)", d.Type, d.Message)
		case page.EventJavascriptDialogOpening:
			t.Errorf("the page opened a %s dialog: %q (a value ran as script)", d.Type, d.Message)
		}
	}))
	return ctx
}

// startConsole runs `ferry ui` on the database with the token and returns
// the console's address.
func startConsole(t *testing.T, token string, db ...string) string {
	t.Helper()
	cmd := exec.Command(ferryBin, append([]string{"ui", "--ui-addr", "127.0.0.1:0"}, db...)...)
	cmd.Env = append(os.Environ(), "FERRY_UI_TOKEN="+token)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	console := ""
	for console == "" && lines.Scan() {
		if m := regexp.MustCompile(`the console: (http://\S+/) `).FindStringSubmatch(lines.Text()); m != nil {
			console = m[1]
		}
	}
	require.NotEmpty(t, console, "ferry ui prints the console's address")
	go func() {
		for lines.Scan() {
		}
	}()
	return console
}

// The hostile values: each must show as the text it is.
const (
	hostileKey     = `<script>alert("key")</script>`
	hostilePayload = `<img src=x onerror=alert("payload")> "quoted" & 'single' </pre><b>`
	hostileHeader  = `<b onmouseover=alert(1)>bold</b>`
)

// TestConsoleInABrowser drives the web console `ferry ui` serves with
// headless Chromium, on a running pipeline (an outbox relayed into a
// consumer group's inbox): the overview shows the group; its dead event,
// with hostile key, payload and header, is found on the group's page and
// shown as text; redriving it without the token is refused; with it, the
// redrive shows its count first, then the event is processed, which its
// timeline shows. A relay dead letter is found on the dead-letter page
// under its reason and redriven until its timeline shows it processed.
// FERRY_CONSOLE_SCREENSHOTS=dir saves the pages as PNGs
// (docs/console-*.png are made so).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)

	// The pipeline: a relay into group billing's inbox, whose handler
	// fails the poison event until told otherwise.
	var failing atomic.Bool
	failing.Store(true)
	billing, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", MaxAttempts: 1, PollInterval: 50 * time.Millisecond,
		ActivityInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	billing.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if ev.Key == hostileKey && failing.Load() {
			return fmt.Errorf("card declined for %s", hostileKey)
		}
		return nil
	})
	relay, err := ferry.NewRelay(drv, billing.Sink(), &ferry.RelayConfig{PollInterval: 50 * time.Millisecond, ActivityInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	relayCtx, stopRelay := context.WithCancel(runCtx)
	done, relayDone := make(chan error, 1), make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	go func() { done <- billing.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-relayDone)
		require.NoError(t, <-done)
	})
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	for i := range 20 {
		require.NoError(t, client.Emit(context.Background(), &ferry.Event{Topic: "orders", Key: fmt.Sprintf("customer-%d", i%5), Type: "OrderPlaced", Payload: []byte(`{"total":12}`)}))
	}
	poison := &ferry.Event{Topic: "orders", Key: hostileKey, Type: "OrderPlaced", Payload: []byte(hostilePayload), Headers: map[string]string{"x-note": hostileHeader}}
	require.NoError(t, client.Emit(context.Background(), poison))
	id := poison.ID.String()
	require.Eventually(t, func() bool {
		rows, err := drv.ListInbox(context.Background(), &ferrydriver.ListInboxParams{Group: "billing", States: []ferrydriver.InboxState{ferrydriver.InboxDead}, Limit: 10})
		require.NoError(t, err)
		return len(rows) == 1
	}, time.Minute, 20*time.Millisecond, "the poison event goes dead")

	const token = "console-test-token"
	console := startConsole(t, token, db...)
	shots := os.Getenv("FERRY_CONSOLE_SCREENSHOTS")
	step := func() context.Context {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		t.Cleanup(cancel)
		return c
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(step(), steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(step(), chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "the text of %s", sel)
		return v
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(step(), chromedp.Evaluate[string](expr))
		require.NoError(t, err, expr)
		return v
	}
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(step(), chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, "console-"+name+".png"), png, 0o644))
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	// No element may come from a value: the page's own markup has none of these in main.
	const injected = `String(document.querySelectorAll('main img, main script, main [onerror], main [onmouseover]').length)`

	// Reads need the token: the page says so until it has it.
	do("a page without the token", chromedp.Navigate(console), chromedp.WaitVisible(css(`#error`)))
	require.Contains(t, text(`#error`), "a read needs the console's token")
	require.Contains(t, text(`#token-state`), "reads and actions need the token")
	// A page of another site that rebinds its name to this machine: the
	// console answers nothing to that name (Chromium resolves *.localhost
	// to the loopback address, as a rebound name would).
	port := regexp.MustCompile(`:(\d+)/$`).FindStringSubmatch(console)[1]
	do("a foreign host", chromedp.Navigate("http://rebound.localhost:"+port+"/api/v1/feeds"), chromedp.WaitReady(css(`body`)))
	require.Contains(t, text(`body`), "does not answer to host")
	require.NotContains(t, text(`body`), "default/0")

	// The overview of the running pipeline, once the token is given.
	do("the overview shows the group", chromedp.Navigate(console), chromedp.SendKeys(css(`#token`), token), chromedp.Click(css(`#token-form button`)),
		chromedp.WaitVisible(css(`#groups [data-group="billing"]`)), chromedp.WaitVisible(css(`#feeds [data-feed="default/0"]`)),
		chromedp.Sleep(4*time.Second)) // a few samples for the charts
	require.Contains(t, text(`#groups [data-group="billing"]`), "dead")
	// The series the relay and the consumer recorded: events per second
	// over the last minutes, with their latency (the 21 events went
	// through before the page opened: the charts show them, not the
	// current rate).
	require.Contains(t, text(`#feeds [data-feed="default/0"]`), "published/s")
	require.Contains(t, text(`#groups [data-group="billing"]`), "applied/s")
	for _, chart := range []string{"events published per second", "events applied per second"} {
		peak := eval(`(() => { const t = document.querySelector('svg[aria-label="` + chart + `"] title'); return t ? t.textContent.replace(/.*max /, '') : 'none'; })()`)
		require.NotContains(t, []string{"none", "0"}, peak, "%s: the chart shows the events that went through", chart)
	}
	require.Contains(t, eval(`document.querySelector('#feeds [data-feed="default/0"] svg[aria-label="events behind"] title').textContent`), "the last 15m",
		"the lag chart is drawn from the relay's samples")
	shot("overview")

	// The dead event, on the group's page, grouped by its reason.
	row := fmt.Sprintf(`tr[data-id="%s"]`, id)
	do("the group's dead event is listed", chromedp.Click(css(`#groups [data-group="billing"] a[href$="state=dead"]`)), chromedp.WaitVisible(css(row)))
	require.Contains(t, text(row), hostileKey, "the key shows as text")
	require.Equal(t, id, text(row+` td:first-child a`), "the whole event ID: UUIDv7s of one minute share their first digits")
	require.Equal(t, "console.js", eval(`[...document.scripts].map(s => s.src.split('/').pop()).join(',')`), "the page runs its own script only")
	require.Equal(t, "0", eval(injected), "no element came from the values")
	require.Equal(t, "card declined for "+hostileKey, text(`section.reason .head .text`))
	require.Contains(t, text(`main`), "Grouped by reason over all 1;", "the server groups the group's dead events")
	require.Equal(t, "hold", eval(`document.getElementById('policy').dataset.policy`), "the group's stored dead policy")
	require.Equal(t, "true", eval(`String(document.querySelector('#policy button.active').disabled)`), "the policy in force is the pressed button")
	shot("group-dead")

	// The search box finds an event by its ID, and a key by its name.
	do("an event found by its ID", chromedp.SendKeys(css(`#search-input`), id), chromedp.Click(css(`#search button`)),
		chromedp.WaitVisible(css(`#timeline li[data-group="billing"]`)))
	require.Contains(t, text(`h1`), id)
	do("a key found by its name", chromedp.SendKeys(css(`#search-input`), hostileKey), chromedp.Click(css(`#search button`)),
		chromedp.WaitVisible(css(`#key-name`)))
	require.Equal(t, hostileKey, eval(`document.getElementById('key-name').textContent`))
	require.Equal(t, "0", eval(injected), "no element came from the values")
	do("back to the group", chromedp.Navigate(console+"#/groups/billing?state=dead"), chromedp.WaitVisible(css(row)))

	// Where its key stands: its dead head holds it in billing.
	do("the key's page", chromedp.Click(css(row+` td.clip a`)), chromedp.WaitVisible(css(`table[data-group="billing"] `+row)))
	require.Equal(t, hostileKey, eval(`document.getElementById('key-name').textContent`))
	require.Contains(t, text(`table[data-group="billing"] `+row), "dead")
	require.Equal(t, "0", eval(injected), "no element came from the values")
	shot("key")
	do("back to the group", chromedp.Navigate(console+"#/groups/billing?state=dead"), chromedp.WaitVisible(css(row)))

	// The redrive: the count first, then the redrive.
	failing.Store(false)
	do("the redrive shows its count", chromedp.Click(css(`section.reason .head button.primary`)), chromedp.WaitVisible(css(`.confirm`)))
	require.Contains(t, text(`#token-state`), "token set")
	require.Contains(t, text(`.confirm`), "Redrive: 1 event?")
	do("the redrive runs", chromedp.Click(css(`.confirm button[data-confirm="yes"]`)), chromedp.WaitVisible(css(`#flash:not(.error)`)))
	require.Contains(t, text(`#flash`), "done for 1 event")

	// Its timeline: it becomes processed (the page follows it).
	do("the timeline shows it processed", chromedp.Navigate(console+"#/events/"+id),
		chromedp.WaitVisible(css(`#timeline li[data-group="billing"] .state.processed`)))
	require.Contains(t, text(`#timeline`), "Committed to the outbox")
	require.Regexp(t, `by \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (UTC|[+-]\d\d:\d\d), its first delivery`, text(`#published`),
		"bounded by its first delivery's time, with its time zone")
	require.Equal(t, hostilePayload, eval(`document.getElementById('payload').textContent`))
	require.Contains(t, text(`#headers`), hostileHeader)
	require.Equal(t, hostileKey, eval(`document.getElementById('event-key').textContent`))
	// Its history in the group: the attempt that failed, with its error,
	// then the redrive.
	history := `#timeline li[data-group="billing"] ol.attempts`
	require.Contains(t, text(history+` li.dead`), "Attempt 1")
	require.Equal(t, "card declined for "+hostileKey, text(history+` li.dead pre`))
	require.Contains(t, text(history+` li.redrive`), "Redriven")
	require.Equal(t, "2", eval(`String(document.querySelectorAll('`+history+` > li').length)`))
	require.Equal(t, "0", eval(injected), "the values are text, not markup")
	shot("event")
	// Its key's processed events, from the key's page: the group's page
	// of PROCESSED events matched by key over the events it read.
	do("the key's processed events", chromedp.Click(css(`#event-key`)), chromedp.WaitVisible(css(`#key-processed a`)),
		chromedp.Click(css(`#key-processed a`)), chromedp.WaitVisible(css(row)))
	require.Contains(t, text(`#scanned`), "Matched among")
	require.Contains(t, text(row), hostileKey)
	require.Equal(t, "0", eval(injected), "the values are text, not markup")

	// A relay dead letter (as a broker's refusal leaves one; put in place
	// here, on a feed of its own), found on the dead-letter page under its
	// reason, redriven: its feed's relay publishes it and billing applies it.
	lease, err := drv.AcquireLease(context.Background(), &ferrydriver.LeaseParams{Name: "manual/0", Holder: "console-test", TTL: time.Minute})
	require.NoError(t, err)
	refused := &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "customer-dl", Type: "OrderPlaced", Seq: 1, Payload: []byte(`{"total":1}`), CreatedAt: time.Now()}
	reason := "refused by the broker: " + hostileKey
	require.NoError(t, drv.InsertDeadLetters(context.Background(), &ferrydriver.InsertDeadLettersParams{Feed: "manual/0", Holder: "console-test", Term: lease.Term,
		DeadLetters: []*ferrydriver.DeadLetter{{Feed: "manual/0", Event: *refused, Reason: reason, FailedAt: time.Now()}}}))
	require.NoError(t, drv.ReleaseLease(context.Background(), &ferrydriver.LeaseParams{Name: "manual/0", Holder: "console-test", Term: lease.Term}))
	dlRow := fmt.Sprintf(`tr[data-id="%s"]`, refused.ID)
	do("the relay's dead letter, by reason", chromedp.Navigate(console+"#/dead-letters"), chromedp.WaitVisible(css(dlRow)))
	require.Equal(t, reason, text(`section.reason .head .text`))
	require.Contains(t, text(`main`), "Grouped by reason over all 1;", "the server groups the dead letters")
	require.Equal(t, "0", eval(injected), "the values are text, not markup")
	shot("dead-letters")
	do("its redrive shows its count", chromedp.Click(css(`section.reason .head button.primary`)), chromedp.WaitVisible(css(`.confirm`)))
	require.Contains(t, text(`.confirm`), "Redrive: 1 event?")
	do("its redrive runs", chromedp.Click(css(`.confirm button[data-confirm="yes"]`)), chromedp.WaitVisible(css(`#flash:not(.error)`)))
	require.Contains(t, text(`#flash`), "done for 1 event")
	do("the dead letter is gone", chromedp.WaitVisible(css(`#empty`)))
	// It went back to its feed, manual/0, and to no other: that feed's
	// relay publishes it (reading the outbox too, whose events billing's
	// inbox already has).
	manual, err := ferry.NewRelay(drv, billing.Sink(), &ferry.RelayConfig{Feed: "manual", PollInterval: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	manualDone := make(chan error, 1)
	go func() { manualDone <- manual.Run(relayCtx) }()
	do("its timeline shows it processed", chromedp.Navigate(console+"#/events/"+refused.ID.String()),
		chromedp.WaitVisible(css(`#timeline li[data-group="billing"] .state.processed`)))

	// The overview shows every feed: default's and manual's.
	do("the overview shows every feed", chromedp.Navigate(console), chromedp.WaitVisible(css(`#feeds [data-feed="manual/0"]`)),
		chromedp.WaitVisible(css(`#feeds [data-feed="default/0"]`)))

	// With the relay stopped, an event waits in the outbox: its timeline
	// says where.
	stopRelay()
	require.NoError(t, <-relayDone)
	require.NoError(t, <-manualDone)
	relayDone <- nil // for the cleanup
	waiting := &ferry.Event{Topic: "orders", Key: "customer-late", Type: "OrderPlaced", Payload: []byte(`{"total":3}`)}
	require.NoError(t, client.Emit(context.Background(), waiting))
	do("an unpublished event's timeline", chromedp.Navigate(console+"#/events/"+waiting.ID.String()), chromedp.WaitVisible(css(`#unpublished`)))
	require.Contains(t, text(`#unpublished`), "Waiting in the outbox")
	require.Contains(t, text(`#unpublished`), "0 events ahead of it in default/0")

	// The address `ferry ui` prints carries the token in its fragment: the
	// page keeps it for the tab and takes it out of the address.
	do("a fresh tab", chromedp.Evaluate[chromedp.Void](`sessionStorage.clear()`))
	do("the printed address", chromedp.Navigate(console+"#token="+token), chromedp.WaitVisible(css(`#groups [data-group="billing"]`)))
	require.Equal(t, token, eval(`sessionStorage.getItem('ferry-console-token')`))
	require.Equal(t, "#/", eval(`location.hash`))
	require.Contains(t, text(`#token-state`), "token set")

}
