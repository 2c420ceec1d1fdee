package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
)

// ferry bench e2e's breakdown: when each event passed each stage between
// its producer's commit and the commit of the consumer transaction that
// applied it. The relay's sink and the consumer's source are wrapped to
// stamp the events that pass them; the handler and the consumer's
// transaction stamp the last two stages.

// stages are one phase's stamps, a benchArrivals per stage, all for the
// events of Type "<prefix><i>".
type stages struct {
	read      *benchArrivals // the relay hands the event to the sink
	published *benchArrivals // JetStream acknowledged it
	received  *benchArrivals // the consumer's source got it
	ingested  *benchArrivals // its inbox transaction committed
	handled   *benchArrivals // a worker called its handler
	applied   *benchArrivals // the handler's transaction committed
}

func newStages(prefix string, n int) *stages {
	return &stages{read: newPhaseArrivals(prefix, n), published: newPhaseArrivals(prefix, n), received: newPhaseArrivals(prefix, n),
		ingested: newPhaseArrivals(prefix, n), handled: newPhaseArrivals(prefix, n), applied: newPhaseArrivals(prefix, n)}
}

// stageStamps holds the current phase's stages (none between phases).
type stageStamps struct{ cur atomic.Pointer[stages] }

func (s *stageStamps) stamp(pick func(*stages) *benchArrivals, evs ...*ferryevent.Event) {
	st := s.cur.Load()
	if st == nil {
		return
	}
	now := time.Now().UnixNano()
	a := pick(st)
	for _, ev := range evs {
		a.record(ev, now)
	}
}

// stampedSink is the relay's JetStream sink, stamping what it is given and
// what JetStream acknowledged; the sink's other methods are its own.
type stampedSink struct {
	*ferrynats.Sink
	stamps *stageStamps
}

func (s *stampedSink) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	return s.PublishEach(ctx, events, nil)
}

func (s *stampedSink) PublishEach(ctx context.Context, events []*ferryevent.Event, done func(int, error)) []error {
	s.stamps.stamp(func(st *stages) *benchArrivals { return st.read }, events...)
	return s.Sink.PublishEach(ctx, events, func(i int, err error) {
		if err == nil {
			s.stamps.stamp(func(st *stages) *benchArrivals { return st.published }, events[i])
		}
		if done != nil {
			done(i, err)
		}
	})
}

// stampedSource is the consumer's JetStream source, stamping what it
// receives and what its ingest committed.
type stampedSource struct {
	*ferrynats.Source
	stamps *stageStamps
}

func (s *stampedSource) Run(ctx context.Context, ingest func(ctx context.Context, events []*ferryevent.Event) error) error {
	return s.Source.Run(ctx, s.wrap(ingest))
}

func (s *stampedSource) RunShare(ctx context.Context, i int, ingest func(ctx context.Context, events []*ferryevent.Event) error) error {
	return s.Source.RunShare(ctx, i, s.wrap(ingest))
}

func (s *stampedSource) wrap(ingest func(ctx context.Context, events []*ferryevent.Event) error) func(ctx context.Context, events []*ferryevent.Event) error {
	return func(ctx context.Context, events []*ferryevent.Event) error {
		s.stamps.stamp(func(st *stages) *benchArrivals { return st.received }, events...)
		err := ingest(ctx, events)
		if err == nil {
			s.stamps.stamp(func(st *stages) *benchArrivals { return st.ingested }, events...)
		}
		return err
	}
}

// reportStages prints, for the events that passed every stage, how long
// each stage took them. A stage's percentiles are its own: they do not
// add up to the whole's. JetStream's acknowledgement can reach the relay
// after the consumer's source got the event; such a leg counts as 0.
func reportStages(w io.Writer, p *production, st *stages) {
	names := []string{"commit -> relay read:", "read -> JetStream ack:", "ack -> source received:", "received -> ingested:", "ingested -> handler:", "handler -> applied:"}
	legs := make([][]time.Duration, len(names))
	for i := range p.intended {
		at := []int64{p.committed[i].Load(), st.read.at[i].Load(), st.published.at[i].Load(), st.received.at[i].Load(),
			st.ingested.at[i].Load(), st.handled.at[i].Load(), st.applied.at[i].Load()}
		if slices.Contains(at, 0) {
			continue
		}
		for j := range legs {
			legs[j] = append(legs[j], time.Duration(max(0, at[j+1]-at[j])))
		}
	}
	fmt.Fprintf(w, "  by stage (%d events that passed every stage):\n", len(legs[0]))
	for j, name := range names {
		fmt.Fprintf(w, "    %-25s %s\n", name, percentiles(legs[j]))
	}
}
