package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// headerFlags collects repeated --header name=value flags.
type headerFlags map[string]string

func (h headerFlags) String() string { return fmt.Sprint(map[string]string(h)) }
func (h headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: use name=value", v)
	}
	h[name] = value
	return nil
}

// cmdEmit writes events to the outbox from the command line, for trying
// Ferry out and for scripts. Applications use Client.EmitTx.
func cmdEmit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("emit", stderr)
	var db dbFlags
	db.register(f)
	var topic, key, typ, source, contentType, data string
	var count int
	headers := headerFlags{}
	f.String(&topic, "topic", "FERRY_EMIT_TOPIC", "", "event topic (required)")
	f.String(&key, "key", "FERRY_EMIT_KEY", "", "event key (required); events of one key stay in order")
	f.String(&typ, "type", "FERRY_EMIT_TYPE", "", "event type (required), e.g. OrderPlaced")
	f.String(&source, "source", "FERRY_EMIT_SOURCE", "ferry-cli", "event source")
	f.String(&contentType, "content-type", "FERRY_EMIT_CONTENT_TYPE", "application/json", "payload media type")
	f.String(&data, "data", "FERRY_EMIT_DATA", "", "payload; @file reads a file, @- reads standard input")
	f.Int(&count, "count", "FERRY_EMIT_COUNT", 1, "emit this many copies (with distinct IDs) in one transaction")
	f.fs.Var(headers, "header", "a header name=value (repeatable) (FERRY_EMIT_HEADERS: one name=value per line)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if v, ok := os.LookupEnv("FERRY_EMIT_HEADERS"); ok && !f.isSet("header") {
		for _, line := range strings.Split(v, "\n") {
			if line = strings.TrimRight(line, "\r"); line == "" {
				continue
			}
			if err := headers.Set(line); err != nil {
				return usagef("FERRY_EMIT_HEADERS: %v (one name=value per line; it sets --header)", err)
			}
		}
	}
	payload := []byte(data)
	if strings.HasPrefix(data, "@") {
		var err error
		if data == "@-" {
			payload, err = io.ReadAll(os.Stdin)
		} else {
			payload, err = os.ReadFile(data[1:])
		}
		if err != nil {
			return fmt.Errorf("--data %s: %w", data, err)
		}
	}
	if count < 1 {
		return usagef("--count %d: use 1 or more", count)
	}
	b, err := db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	events := make([]*ferry.Event, count)
	for i := range events {
		events[i] = &ferry.Event{Topic: topic, Key: key, Type: typ, Source: source, ContentType: contentType, Headers: headers, Payload: payload}
	}
	if err := b.emit(ctx, events...); err != nil {
		var ve *ferry.ValidationError
		if errors.As(err, &ve) {
			flagOf := map[string]string{"Topic": "--topic", "Key": "--key", "Type": "--type", "Payload": "--data", "Headers": "--header", "Source": "--source", "ContentType": "--content-type"}
			return usagef("%v (see %s)", err, flagOf[ve.Field])
		}
		return err
	}
	for _, ev := range events {
		fmt.Fprintln(stdout, ev.ID)
	}
	return nil
}

// cmdTail prints the events stored in the JetStream stream.
func cmdTail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("tail", stderr)
	var natsURL, stream string
	var count int
	var asJSON, follow bool
	var wait time.Duration
	var dataDir string
	f.String(&natsURL, "nats-url", "FERRY_NATS_URL", "", "NATS server URL (default: the embedded server that ferry run started for --data-dir, if it runs; else "+nats.DefaultURL+")")
	f.String(&dataDir, "data-dir", "FERRY_DATA_DIR", "ferry-data", "directory of the embedded defaults, where ferry run records its embedded NATS server's URL")
	f.String(&stream, "stream", "FERRY_STREAM", ferrynats.DefaultStream, "JetStream stream to read")
	f.Int(&count, "count", "FERRY_TAIL_COUNT", 0, "stop after this many events (0: no limit)")
	f.Bool(&follow, "follow", "FERRY_TAIL_FOLLOW", false, "keep waiting for new events")
	f.Duration(&wait, "wait", "FERRY_TAIL_WAIT", 2*time.Second, "without --follow, stop after this long without a new event")
	f.Bool(&asJSON, "json", "FERRY_TAIL_JSON", false, "print one JSON object per event")
	if err := f.Parse(args); err != nil {
		return err
	}
	from := "--nats-url / FERRY_NATS_URL"
	if natsURL == "" {
		natsURL = nats.DefaultURL
		if u, ok := embeddedURL(dataDir); ok {
			natsURL, from = u, "the embedded server `ferry run` recorded in "+filepath.Join(dataDir, "nats", embeddedURLFile)+" (is it still running?)"
		}
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return fmt.Errorf("cannot reach NATS at %s (%s): %w", natsURL, from, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s (--stream / FERRY_STREAM): %w", stream, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	n := 0
	for count == 0 || n < count {
		fetchWait := wait
		if follow {
			fetchWait = 5 * time.Second
		}
		want := 500 // without --count, as many as a fetch takes
		if count > 0 {
			want = min(want, count-n)
		}
		batch, err := cons.Fetch(want, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			return err
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			n++
			ev, err := ferrynats.DecodeJetStream(msg)
			if err != nil {
				fmt.Fprintf(stdout, "%s: undecodable message: %v\n", msg.Subject(), err)
				continue
			}
			if asJSON {
				_ = enc.Encode(map[string]any{"subject": msg.Subject(), "id": ev.ID, "topic": ev.Topic, "key": ev.Key, "seq": ev.Seq,
					"type": ev.Type, "source": ev.Source, "time": ev.CreatedAt, "headers": ev.Headers, "payload": string(ev.Payload)})
				continue
			}
			fmt.Fprintf(stdout, "%s  %-24s %-20s #%-4d %-16s %s\n", ev.CreatedAt.Format("15:04:05.000"), msg.Subject(), ev.Key, ev.Seq, ev.Type, preview(ev.Payload, 60))
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil {
			return err
		}
		if ctx.Err() != nil || (got == 0 && !follow) {
			break
		}
	}
	return nil
}
