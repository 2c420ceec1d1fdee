package ferrywebhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Handler returns an http.Handler receiving the events of a ferrywebhook
// Sink: it accepts POST requests with a body of at most DefaultMaxBodyBytes,
// verifies them against secrets (any of them matches, as during a rotation)
// with DefaultTolerance, checks that ce-id is the signed webhook-id, decodes
// the event and calls handle with the request's context, which names
// "webhook" as the delivery's transport (ferrysink.WithSystem: a
// ferry.Consumer's Ingest called with it reports it on its receive span and
// metric). It answers:
//
//	204 No Content          handle returned nil
//	400 Bad Request         the request is not a well-formed Ferry event (the body says why)
//	401 Unauthorized        the signature does not verify (the sink dead-letters the event)
//	405 Method Not Allowed  not a POST
//	413 Entity Too Large    the body is over DefaultMaxBodyBytes
//	422 Unprocessable       handle returned an error that ferrysink.IsPermanent: the sink
//	                        dead-letters the event with the error's reason
//	500 Internal Error      handle returned another error: the sink retries
//
// Delivery is at least once: handle sees an event again when an answer was
// lost, so make it idempotent on the event ID, for instance by ingesting
// into a Ferry consumer group's inbox. Events of one key arrive in order
// and one at a time, except that a request the sink gave up on (a timeout,
// a broken connection) may still be running here when its retry or the
// key's next event arrives (see the package documentation).
//
// Handler panics when secrets is empty or holds a malformed secret: a
// configuration error to find at start-up. For another tolerance or body
// limit, write the handler with Verify and DecodeRequest, which is all
// Handler does (and give Ingest ferrysink.WithSystem(ctx, "webhook")).
func Handler(secrets []string, handle func(ctx context.Context, ev ferryevent.Event) error) http.Handler {
	keys, err := parseSecrets(secrets)
	if err != nil {
		panic(fmt.Sprintf("ferrywebhook: Handler: %v", err))
	}
	if len(keys) == 0 {
		panic("ferrywebhook: Handler needs at least one secret: pass the Config.Secrets of the sending sink")
	}
	if handle == nil {
		panic("ferrywebhook: Handler needs a handle function")
	}
	return &handler{keys: keys, handle: handle}
}

type handler struct {
	keys   [][]byte
	handle func(ctx context.Context, ev ferryevent.Event) error
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "ferrywebhook: send events with POST", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, DefaultMaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "ferrywebhook: body larger than "+strconv.Itoa(DefaultMaxBodyBytes)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "ferrywebhook: read the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	// Unauthenticated callers learn nothing but the verdict.
	if err := verify(h.keys, r.Header, body, DefaultTolerance, time.Now()); err != nil {
		http.Error(w, "ferrywebhook: invalid webhook signature", http.StatusUnauthorized)
		return
	}
	ev, err := decode(r.Header, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if signed, err := uuid.Parse(r.Header.Get(HeaderID)); err != nil || signed != ev.ID {
		http.Error(w, "ferrywebhook: ce-id differs from the signed webhook-id", http.StatusUnauthorized)
		return
	}
	if err := h.handle(ferrysink.WithSystem(r.Context(), "webhook"), ev); err != nil {
		var pe *ferrysink.PermanentError
		if errors.As(err, &pe) {
			http.Error(w, "ferrywebhook: event "+ev.ID.String()+" refused: "+pe.Reason, http.StatusUnprocessableEntity)
			return
		}
		// The error itself stays here: it may hold internal details.
		http.Error(w, "ferrywebhook: handling event "+ev.ID.String()+" failed; send it again later", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
