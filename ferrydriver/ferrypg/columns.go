package ferrypg

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
)

// eventArrays are events as parallel column arrays, the form in which the
// outbox, inbox and dead-letter statements take them (one round trip for a
// whole batch, through unnest). Headers are JSON text, "" for none.
type eventArrays struct {
	ids                                                 []uuid.UUID
	topics, keys, types, sources, contentTypes, headers []string
	seqs                                                []int64
	payloads                                            [][]byte
	created                                             []time.Time
}

func encodeEvents(events []*ferryevent.Event) (*eventArrays, error) {
	n := len(events)
	a := &eventArrays{
		ids: make([]uuid.UUID, n), topics: make([]string, n), keys: make([]string, n), types: make([]string, n),
		sources: make([]string, n), contentTypes: make([]string, n), headers: make([]string, n),
		seqs: make([]int64, n), payloads: make([][]byte, n), created: make([]time.Time, n),
	}
	for i, ev := range events {
		a.ids[i], a.topics[i], a.keys[i], a.types[i] = ev.ID, ev.Topic, ev.Key, ev.Type
		a.sources[i], a.contentTypes[i], a.seqs[i], a.created[i] = ev.Source, ev.ContentType, ev.Seq, ev.CreatedAt
		if len(ev.Headers) > 0 {
			b, err := json.Marshal(ev.Headers)
			if err != nil {
				return nil, fmt.Errorf("ferrypg: encode headers of event %s: %w", ev.ID, err)
			}
			a.headers[i] = string(b)
		}
		a.payloads[i] = ev.Payload
		if a.payloads[i] == nil {
			a.payloads[i] = []byte{} // the payload column is NOT NULL
		}
	}
	return a, nil
}

// decodeHeaders parses a headers column read as text (nil: no headers).
func decodeHeaders(ev *ferryevent.Event, headers *string) error {
	if headers == nil {
		return nil
	}
	if err := json.Unmarshal([]byte(*headers), &ev.Headers); err != nil {
		return fmt.Errorf("decode headers of event %s: %w", ev.ID, err)
	}
	return nil
}
