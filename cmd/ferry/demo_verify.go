package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/nats-io/nats.go/jetstream"
)

// What the demo checks once the crashes stop, and how it reports it.

// waitApplied shows progress until every order's event is applied. It
// fails if nothing moves for 30 s, or the producers fail.
func (d *demo) waitApplied(ctx context.Context, produceErr <-chan error) error {
	tick := time.NewTicker(d.cfg.interval)
	defer tick.Stop()
	var lastApplied, lastPublished, lastProduced int64
	lastMove := time.Now()
	lastAt := time.Now()
	prodDone := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-produceErr:
			if err != nil {
				return fmt.Errorf("a producer failed: %w", err)
			}
			prodDone = true
			produceErr = nil
			continue
		case <-tick.C:
		}
		applied, err := d.count(ctx, `SELECT count(DISTINCT event_id) FROM applications`)
		if err != nil {
			return err
		}
		published := d.streamMsgs(ctx)
		produced := d.produced.Load()
		now := time.Now()
		secs := now.Sub(lastAt).Seconds()
		rate := func(v, last int64) string { return thousands(int64(float64(v-last)/secs)) + "/s" }
		d.progress(fmt.Sprintf("produced %s (%s)  published %s (%s)  applied %s (%s)  lag %s",
			thousands(produced), rate(produced, lastProduced), thousands(published), rate(published, lastPublished),
			thousands(applied), rate(applied, lastApplied), thousands(produced-applied)))
		if applied != lastApplied {
			lastMove = now
		}
		lastProduced, lastPublished, lastApplied, lastAt = produced, published, applied, now
		if prodDone && applied >= int64(d.cfg.events) {
			if d.cfg.tty {
				fmt.Fprintln(d.cfg.out)
			}
			return nil
		}
		if now.Sub(lastMove) > 30*time.Second {
			if d.cfg.tty {
				fmt.Fprintln(d.cfg.out)
			}
			return fmt.Errorf("no event applied for 30 s (%s of %s)", thousands(applied), thousands(int64(d.cfg.events)))
		}
	}
}

func (d *demo) count(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	err := d.drv.ReadDB().QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

func (d *demo) streamMsgs(ctx context.Context) int64 {
	s, err := d.js.Stream(ctx, demoStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return int64(info.State.Msgs)
}

// verify recomputes every figure from the database and the stream.
func (d *demo) verify(ctx context.Context) (*demoReport, error) {
	r := &demoReport{
		DupPublish: int64(d.dupPublish.Load()), DupInbox: d.dupInbox.Load(),
		RelayCrashes: d.relayCrashes.Load(), ConsumerCrashes: d.consumerCrashs.Load(),
	}
	q := func(dst *int64, query string, args ...any) error {
		if err := d.drv.ReadDB().QueryRowContext(ctx, query, args...).Scan(dst); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		return nil
	}
	for _, c := range []struct {
		dst   *int64
		query string
		args  []any
	}{
		{&r.Produced, `SELECT count(*) FROM orders`, nil},
		{&r.Applied, `SELECT count(DISTINCT event_id) FROM applications`, nil},
		{&r.AppliedTwice, `SELECT count(*) - count(DISTINCT event_id) FROM applications`, nil},
		{&r.Violations, `SELECT count(*) FROM order_violations`, nil},
		{&r.SeqMismatch, `SELECT count(*) FROM (SELECT customer, count(*) AS n FROM orders GROUP BY customer) o
			LEFT JOIN customer_totals t USING (customer) WHERE t.last_seq IS NOT o.n`, nil},
		{&r.Customers, `SELECT count(DISTINCT customer) FROM orders`, nil},
		{&r.ProjectionMismatch, `SELECT count(*) FROM (SELECT customer, count(*) AS n, sum(amount_cents) AS total FROM orders GROUP BY customer) o
			FULL JOIN customer_totals t USING (customer) WHERE o.n IS NOT t.orders OR o.total IS NOT t.total_cents`, nil},
		{&r.Dead, `SELECT count(*) FROM ferry_inbox WHERE group_name = ? AND state = 'dead'`, []any{demoGroup}},
	} {
		if err := q(c.dst, c.query, c.args...); err != nil {
			return nil, err
		}
	}
	// Read the whole stream back: which orders reached JetStream, and how
	// many times.
	seen := map[int64]int{}
	s, err := d.js.Stream(ctx, demoStream)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	total := int64(info.State.Msgs)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	var read int64
	for read < total {
		batch, err := cons.Fetch(int(min(1000, total-read)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("verify: read the stream: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			read++
			ev, err := ferrynats.DecodeJetStream(msg)
			if err != nil {
				return nil, fmt.Errorf("verify: message %d of the stream: %w", read, err)
			}
			var o order
			if err := json.Unmarshal(ev.Payload, &o); err != nil {
				return nil, fmt.Errorf("verify: event %s: %w", ev.ID, err)
			}
			seen[o.OrderID]++
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("verify: read the stream: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("verify: the stream stopped after %d of %d messages", read, total)
		}
	}
	rows, err := d.drv.ReadDB().QueryContext(ctx, `SELECT id FROM orders`)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		switch n := seen[id]; {
		case n == 0:
			r.Missing++
		default:
			r.InStream++
			r.StreamDuplicates += int64(n - 1)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	want := int64(d.cfg.events)
	r.checks = []demoCheck{
		{"orders committed, each with its event", thousands(r.Produced), r.Produced == want},
		{"orders whose event reached JetStream", fmt.Sprintf("%s (missing %s)", thousands(r.InStream), thousands(r.Missing)), r.Missing == 0 && r.InStream == r.Produced},
		{"events stored twice in the stream", thousands(r.StreamDuplicates), r.StreamDuplicates == 0},
		{"events applied by the consumer group", thousands(r.Applied), r.Applied == r.Produced},
		{"events applied twice", thousands(r.AppliedTwice), r.AppliedTwice == 0},
		{"events applied out of their customer's order", thousands(r.Violations), r.Violations == 0 && r.SeqMismatch == 0},
		{"projection equals the totals recomputed from orders", fmt.Sprintf("%s of %s customers differ", thousands(r.ProjectionMismatch), thousands(r.Customers)), r.ProjectionMismatch == 0},
		{"consumer dead letters", thousands(r.Dead), r.Dead == 0},
	}
	return r, nil
}

func (d *demo) printReport(r *demoReport) {
	w := d.cfg.out
	fmt.Fprintf(w, "\nVerification, recomputed from the database and the stream:\n")
	width := 0
	for _, c := range r.checks {
		width = max(width, len(c.name))
	}
	for _, c := range r.checks {
		mark := "PASS"
		if !c.pass {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %-*s  %s\n", mark, width, c.name, c.value)
	}
	fmt.Fprintf(w, "\nAbsorbed on the way (harmless by design):\n")
	fmt.Fprintf(w, "  %s republished events dropped by JetStream's duplicate window (Nats-Msg-Id = event ID)\n", thousands(r.DupPublish))
	fmt.Fprintf(w, "  %s redelivered events ignored by the consumer's inbox\n", thousands(r.DupInbox))
	if d.cfg.crash {
		fmt.Fprintf(w, "  %d relay crashes, %d consumer crashes\n", r.RelayCrashes, r.ConsumerCrashes)
	}
	verdict := "All checks passed"
	if !r.ok() {
		verdict = "Some checks FAILED"
	}
	fmt.Fprintf(w, "\n%s in %.1f s.\n", verdict, r.Elapsed.Seconds())
}

// thousands formats n with thousands separators.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// plural is "1 order", "2 orders", "1,000 orders".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return thousands(int64(n)) + " " + noun + "s"
}
