package ferryevent

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// TypeRetraction is the Type of the event that compensates a retracted
// one: an event a consumer group had already processed when its source was
// undone (a chain reorg orphaned its block). Its payload is the retracted
// event, as JSON.
const TypeRetraction = "ferry.retraction"

// retractionNamespace derives a compensation's ID from the retracted
// event's, so that retracting an event twice yields one compensation.
var retractionNamespace = uuid.MustParse("0b6c2f8e-93a4-4c1e-b7d5-6f2a91c3e4d7")

// NewRetraction returns the compensation of ev: same Topic and Key (so it
// runs in the key's order), Type TypeRetraction, an ID derived from ev.ID,
// and ev itself as the payload.
func NewRetraction(ev *Event) (*Event, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("ferryevent: encode the retracted event %s: %w", ev.ID, err)
	}
	return &Event{
		ID:          uuid.NewSHA1(retractionNamespace, ev.ID[:]),
		Topic:       ev.Topic,
		Key:         ev.Key,
		Type:        TypeRetraction,
		Source:      ev.Source,
		ContentType: "application/json",
		Payload:     body,
		CreatedAt:   ev.CreatedAt,
		Seq:         0,
	}, nil
}

// RetractedEvent returns the event that comp, a TypeRetraction event,
// compensates.
func RetractedEvent(comp *Event) (*Event, error) {
	if comp.Type != TypeRetraction {
		return nil, fmt.Errorf("ferryevent: event %s has type %q, not %q", comp.ID, comp.Type, TypeRetraction)
	}
	var ev Event
	if err := json.Unmarshal(comp.Payload, &ev); err != nil {
		return nil, fmt.Errorf("ferryevent: decode the event retracted by %s: %w", comp.ID, err)
	}
	if ev.ID == uuid.Nil {
		return nil, errors.New("ferryevent: retraction " + comp.ID.String() + " names no event")
	}
	return &ev, nil
}
