package ferrynats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
	"github.com/nats-io/nats.go/jetstream"
)

// One reader of a share: its pull loop, from fetching messages to
// acknowledging them once the inbox has them, and its recovery when the
// durable consumer goes away.

// delivery is a message delivered to the run and not yet settled.
type delivery struct {
	msg jetstream.Msg
	seq uint64 // stream sequence
	ev  *ferryevent.Event
	// older holds earlier deliveries of the same stream message, which
	// JetStream sent again after their ack wait: they are acknowledged and
	// released with msg.
	older []jetstream.Msg
}

// run is the state of one Source.Run call. Only Run's goroutine changes
// it; mu guards held against the keepalive goroutine, which reads it.
type run struct {
	s      *Source
	l      *line
	log    *slog.Logger
	ingest func(context.Context, []*ferryevent.Event) error
	retry  backoff.Policy

	mu sync.Mutex
	// held is every message delivered to this run and not yet acknowledged,
	// terminated or released, in stream order, one entry per stream
	// message.
	held []*delivery

	// lastDelivery is the consumer (delivery) sequence of the last message
	// received. JetStream numbers every delivery of the durable, so a jump
	// means some went to someone else, or were lost on the way.
	lastDelivery uint64
	// recovering is set while messages pending on the durable may be
	// outside held: ingesting then could put a later message of a key ahead
	// of one JetStream will deliver again. It ends when the durable's
	// pending count equals len(held), or at recoverBy.
	recovering bool
	recoverBy  time.Time
}

func (r *run) loop(ctx context.Context) error {
	info, err := r.consumerInfo(ctx)
	if err != nil || info == nil {
		return err // nil when ctx ended
	}
	r.lastDelivery = info.Delivered.Consumer
	if info.NumAckPending > 0 {
		r.recover(fmt.Sprintf("%d messages delivered earlier are unacknowledged", info.NumAckPending))
	}

	stop := r.keepAlive()
	defer func() {
		stop()
		r.release()
	}()
	for ctx.Err() == nil {
		if r.recovering {
			r.checkRecovered(ctx)
		}
		if !r.recovering && len(r.held) > 0 {
			r.ingestNext(ctx)
			continue
		}
		if err := r.fetch(ctx); err != nil {
			return err
		}
	}
	return nil
}

// consumerInfo reads the durable's state, retrying until it succeeds, ctx
// ends (nil, nil) or the durable is gone.
func (r *run) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	for attempt := 1; ; attempt++ {
		info, err := r.l.cons.Info(ctx)
		switch {
		case err == nil:
			return info, nil
		case ctx.Err() != nil:
			return nil, nil
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrConsumerDeleted):
			return nil, r.gone(err)
		}
		r.log.Warn("ferrynats: read the durable consumer's state; retrying", "attempt", attempt, "err", err)
		if !r.retry.Sleep(ctx.Done(), attempt) {
			return nil, nil
		}
	}
}

func (r *run) gone(err error) error {
	return fmt.Errorf("ferrynats: durable consumer %q of stream %q is gone: %w; create it again with NewSource and call Run", r.l.durable, r.s.cfg.Stream, err)
}

// recover starts waiting for the durable's pending messages to be in held.
func (r *run) recover(reason string) {
	if r.recovering {
		return
	}
	r.recovering = true
	r.recoverBy = time.Now().Add(2 * r.s.cfg.AckWait)
	r.log.Info("ferrynats: waiting for the durable's unacknowledged messages to be delivered again before ingesting, to keep their order", "reason", reason)
}

// checkRecovered ends recovery once every message pending on the durable is
// held, or at the deadline. The server may count an ack or a termination
// it has not processed yet as pending: that only prolongs recovery.
func (r *run) checkRecovered(ctx context.Context) {
	info, err := r.l.cons.Info(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("ferrynats: read the durable consumer's state", "err", err)
		}
		return
	}
	outside := info.NumAckPending - len(r.held)
	switch {
	case outside <= 0:
		r.recovering = false
		r.log.Debug("ferrynats: every unacknowledged message is back; ingesting", "held", len(r.held))
	case time.Now().After(r.recoverBy):
		r.recovering = false
		r.log.Warn("ferrynats: messages of the durable are still unacknowledged and not delivered here after twice its ack wait; ingesting anyway, their events may arrive out of order. Is another Source running on this durable?",
			"unacknowledged", outside, "ack_wait", r.s.cfg.AckWait)
	}
}

// fetch receives the next messages into held. It returns at once the
// messages already available, or else waits up to MaxWait for one, then
// takes whatever else is available. While recovering it waits MaxWait for
// a full batch instead: a request that does not wait can stall when
// MaxAckPending is reached, until nats.go gives up on it, and a message the
// server sends it after that is lost to this run. fetch returns an error
// only when the durable is gone.
func (r *run) fetch(ctx context.Context) error {
	batch := r.s.cfg.Batch
	var (
		msgs []jetstream.Msg
		err  error
	)
	if r.recovering {
		msgs, err = r.pull(ctx, batch, true)
	} else {
		msgs, err = r.pull(ctx, batch, false)
		if err == nil && len(msgs) == 0 {
			msgs, err = r.pull(ctx, 1, true)
			if err == nil && len(msgs) > 0 && batch > 1 {
				var more []jetstream.Msg
				more, err = r.pull(ctx, batch-1, false)
				msgs = append(msgs, more...)
			}
		}
	}
	for _, m := range msgs {
		r.accept(ctx, m)
	}
	switch {
	case err == nil, ctx.Err() != nil:
		return nil
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
		return r.gone(err)
	}
	if _, infoErr := r.l.cons.Info(ctx); errors.Is(infoErr, jetstream.ErrConsumerNotFound) {
		return r.gone(infoErr)
	}
	r.log.Warn("ferrynats: fetch from the durable consumer failed; retrying", "err", err)
	if len(msgs) > 0 {
		return nil // ingest what arrived first
	}
	t := time.NewTimer(r.s.cfg.MaxWait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

// pull sends one pull request for up to n messages and collects them. With
// wait, the request waits up to MaxWait for them and is abandoned when ctx
// ends; without, it takes what is available now.
func (r *run) pull(ctx context.Context, n int, wait bool) ([]jetstream.Msg, error) {
	var (
		batch jetstream.MessageBatch
		err   error
	)
	if wait {
		// FetchContext asks the server to expire the request a tenth
		// (at most a second) before the context's deadline: set the
		// deadline so that the server waits MaxWait.
		d := r.s.cfg.MaxWait
		if d >= 9*time.Second {
			d += time.Second
		} else {
			d = d * 10 / 9
		}
		fctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		batch, err = r.l.cons.Fetch(n, jetstream.FetchContext(fctx))
	} else {
		batch, err = r.l.cons.FetchNoWait(n)
	}
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	err = batch.Error()
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		// The server's expiry did not arrive before our deadline. A
		// message it sent meanwhile is lost; the next delivery's sequence
		// shows it, and accept starts a recovery.
		err = nil
	}
	return msgs, err
}

// accept decodes a delivered message into held, or hands it to OnInvalid
// and terminates it.
func (r *run) accept(ctx context.Context, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		r.invalid(ctx, m, fmt.Errorf("%w: no JetStream metadata: %v", ErrMalformed, err))
		return
	}
	if dseq := md.Sequence.Consumer; dseq > r.lastDelivery+1 {
		r.recover(fmt.Sprintf("deliveries %d to %d of the durable were not received here", r.lastDelivery+1, dseq-1))
	}
	r.lastDelivery = max(r.lastDelivery, md.Sequence.Consumer)

	ev, err := DecodeJetStream(m)
	if err != nil {
		r.invalid(ctx, m, err)
		return
	}
	seq := md.Sequence.Stream
	r.mu.Lock()
	defer r.mu.Unlock()
	i, found := slices.BinarySearchFunc(r.held, seq, func(d *delivery, seq uint64) int {
		switch {
		case d.seq < seq:
			return -1
		case d.seq > seq:
			return 1
		}
		return 0
	})
	if found {
		// Delivered again, after its ack wait passed: keep the latest
		// delivery, settle both.
		d := r.held[i]
		d.older = append(d.older, d.msg)
		d.msg, d.ev = m, &ev
		return
	}
	r.held = slices.Insert(r.held, i, &delivery{msg: m, seq: seq, ev: &ev})
}

// invalid reports a message that is not a Ferry event and terminates it.
func (r *run) invalid(ctx context.Context, m jetstream.Msg, err error) {
	func() {
		defer func() {
			if p := recover(); p != nil {
				r.log.Error("ferrynats: SourceConfig.OnInvalid panicked", "panic", p, "subject", m.Subject())
			}
		}()
		if r.s.cfg.OnInvalid != nil {
			r.s.cfg.OnInvalid(ctx, m, err)
			return
		}
		attrs := []any{"subject", m.Subject(), "err", err}
		if md, mdErr := m.Metadata(); mdErr == nil {
			attrs = append(attrs, "stream_seq", md.Sequence.Stream)
		}
		r.log.Error("ferrynats: message is not a Ferry event; terminating it", attrs...)
	}()
	if err := m.Term(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		r.log.Warn("ferrynats: terminate a message that is not a Ferry event; JetStream will deliver it again", "subject", m.Subject(), "err", err)
	}
}

// ingestNext hands the first Batch held messages to ingest until it
// succeeds, then acknowledges them. It returns early when ctx ends, leaving
// them held.
func (r *run) ingestNext(ctx context.Context) {
	chunk := r.held[:min(len(r.held), r.s.cfg.Batch)]
	events := make([]*ferryevent.Event, 0, len(chunk))
	seen := make(map[uuid.UUID]bool, len(chunk))
	for _, d := range chunk {
		// Two stream messages may carry one event (published again after
		// the duplicate window); the inbox would keep the first.
		if !seen[d.ev.ID] {
			seen[d.ev.ID] = true
			events = append(events, d.ev)
		}
	}
	for attempt := 1; ; attempt++ {
		err := r.ingest(ctx, events)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("ferrynats: ingest failed; retrying the same batch",
			"attempt", attempt, "events", len(events), "first_stream_seq", chunk[0].seq, "last_stream_seq", chunk[len(chunk)-1].seq, "err", err)
		if !r.retry.Sleep(ctx.Done(), attempt) {
			return
		}
	}
	r.ack(ctx, chunk)
	r.mu.Lock()
	r.held = slices.Delete(r.held, 0, len(chunk))
	r.mu.Unlock()
}

// ack acknowledges an ingested chunk. It waits for the server's reply to
// the last ack only: JetStream processes a consumer's acks in order. A
// failure is logged and otherwise ignored: the events are in the inbox,
// and a message delivered again is a duplicate the inbox drops.
func (r *run) ack(ctx context.Context, chunk []*delivery) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	var failed int
	var last error
	for i, d := range chunk {
		for _, m := range d.older {
			_ = m.Ack() // the server ignores an ack for a message it no longer tracks
		}
		var err error
		if i == len(chunk)-1 {
			err = d.msg.DoubleAck(actx)
		} else {
			err = d.msg.Ack()
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		r.log.Warn("ferrynats: acknowledge ingested messages; JetStream will deliver them again and the inbox will drop the copies",
			"failed", failed, "messages", len(chunk), "err", last)
	}
}

// keepAlive extends the ack deadline of every held message each third of
// AckWait until the returned function is called.
func (r *run) keepAlive() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.s.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r.touch()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

func (r *run) touch() {
	r.mu.Lock()
	msgs := make([]jetstream.Msg, 0, len(r.held))
	for _, d := range r.held {
		msgs = append(msgs, d.msg)
		msgs = append(msgs, d.older...)
	}
	r.mu.Unlock()
	var failed int
	var last error
	for _, m := range msgs {
		// An ack may overtake this; the server ignores progress for a
		// message it no longer tracks.
		if err := m.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		r.log.Warn("ferrynats: extend the ack deadline of held messages; JetStream may deliver them again, which the inbox absorbs",
			"failed", failed, "messages", len(msgs), "err", last)
	}
}

// release hands the held messages back to JetStream for immediate
// redelivery, in stream order, so that the next run receives them before
// anything newer, and flushes the connection.
func (r *run) release() {
	r.mu.Lock()
	held := r.held
	r.held = nil
	r.mu.Unlock()
	if len(held) == 0 {
		return
	}
	for _, d := range held {
		_ = d.msg.Nak() // if lost, the message comes back after AckWait
		for _, m := range d.older {
			_ = m.Nak()
		}
	}
	if err := r.s.js.Conn().FlushTimeout(time.Second); err != nil {
		r.log.Debug("ferrynats: flush released messages", "err", err)
	}
}
