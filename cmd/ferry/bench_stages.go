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

// The stages an event passes, in order, after its producer's commit.
const (
	stageRead      = iota // the relay hands the event to the sink
	stagePublished        // JetStream acknowledged it
	stageReceived         // the consumer's source got it
	stageIngested         // its inbox transaction committed
	stageHandled          // a worker called its handler
	stageApplied          // the handler's transaction committed
	numStages
)

// stageNames name the legs that end at each stage.
var stageNames = [numStages]string{"commit -> relay read:", "read -> JetStream ack:", "ack -> source received:",
	"received -> ingested:", "ingested -> handler:", "handler -> applied:"}

// stages are one phase's stamps, a benchArrivals per stage, all for the
// events of Type prefix (benchArrivals).
type stages [numStages]*benchArrivals

func newStages(prefix string, n int) *stages {
	var st stages
	for i := range st {
		st[i] = newPhaseArrivals(prefix, n)
	}
	return &st
}

// stageStamps holds the current phase's stages (none between phases).
type stageStamps struct{ cur atomic.Pointer[stages] }

// stamp records that evs passed stage now.
func (s *stageStamps) stamp(stage int, evs ...*ferryevent.Event) {
	st := s.cur.Load()
	if st == nil {
		return
	}
	now := time.Now().UnixNano()
	for _, ev := range evs {
		st[stage].record(ev, now)
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
	s.stamps.stamp(stageRead, events...)
	return s.Sink.PublishEach(ctx, events, func(i int, err error) {
		if err == nil {
			s.stamps.stamp(stagePublished, events[i])
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
		s.stamps.stamp(stageReceived, events...)
		err := ingest(ctx, events)
		if err == nil {
			s.stamps.stamp(stageIngested, events...)
		}
		return err
	}
}

// reportStages prints, for the events that passed every stage, how long
// each stage took them. A stage's percentiles are its own: they do not
// add up to the whole's. JetStream's acknowledgement can reach the relay
// after the consumer's source got the event; such a leg counts as 0.
func reportStages(w io.Writer, p *production, st *stages) {
	var legs [numStages][]time.Duration
	for i := range p.intended {
		at := [numStages + 1]int64{p.committed[i].Load()}
		for j, a := range st {
			at[j+1] = a.at[i].Load()
		}
		if slices.Contains(at[:], 0) {
			continue
		}
		for j := range legs {
			legs[j] = append(legs[j], time.Duration(max(0, at[j+1]-at[j])))
		}
	}
	fmt.Fprintf(w, "  by stage (%d events that passed every stage):\n", len(legs[0]))
	for j, name := range stageNames {
		fmt.Fprintf(w, "    %-25s %s\n", name, percentiles(legs[j]))
	}
}
