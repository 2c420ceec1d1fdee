package ferrywebhook_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// The relay normally calls Publish; it is called directly here to show the
// per-event results. The endpoint answers 404 for one path: that event
// fails permanently and the relay would dead-letter it.
func ExampleNew() {
	ctx := context.Background()
	secret := ferrywebhook.NewSecret() // shared with the receivers
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/hooks/orders" {
			http.Error(w, "no such hook", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()

	sink, err := ferrywebhook.New(&ferrywebhook.Config{
		// One path per topic; Config.URL sends everything to one URL.
		Endpoint: func(ev *ferryevent.Event) string { return endpoint.URL + "/hooks/" + ev.Topic },
		Secrets:  []string{secret},
		Timeout:  5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(ctx)

	events := []*ferryevent.Event{
		{ID: ferryevent.NewID(), Topic: "orders", Key: "order-42", Type: "OrderPlaced", Payload: []byte(`{}`), CreatedAt: time.Now()},
		{ID: ferryevent.NewID(), Topic: "invoices", Key: "invoice-7", Type: "InvoiceSent", Payload: []byte(`{}`), CreatedAt: time.Now()},
	}
	for i, err := range sink.Publish(ctx, events) {
		switch {
		case err == nil:
			fmt.Printf("%s: delivered\n", events[i].Type)
		case ferrysink.IsPermanent(err):
			fmt.Printf("%s: dead-lettered\n", events[i].Type)
		default:
			fmt.Printf("%s: retried later\n", events[i].Type)
		}
	}
	// Output:
	// OrderPlaced: delivered
	// InvoiceSent: dead-lettered
}

// A receiving service mounts Handler: it verifies the signature, decodes
// the event and answers for the callback. Here a sink delivers to it, and
// an unsigned request is turned away.
func ExampleHandler() {
	ctx := context.Background()
	secrets := []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}

	mux := http.NewServeMux()
	mux.Handle("POST /hooks/ferry", ferrywebhook.Handler(secrets, func(ctx context.Context, ev ferryevent.Event) error {
		// Deliveries are at least once: apply each event ID once, for
		// instance through a Ferry consumer group's inbox.
		fmt.Printf("received %s for %s (seq %d, trace %s): %s\n", ev.Type, ev.Key, ev.Seq, ev.Headers["traceparent"], ev.Payload)
		return nil
	}))
	receiver := httptest.NewServer(mux)
	defer receiver.Close()

	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: receiver.URL + "/hooks/ferry", Secrets: secrets})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(ctx)
	ev := &ferryevent.Event{
		ID: ferryevent.NewID(), Topic: "orders", Key: "order-42", Type: "OrderPlaced", Seq: 1,
		Headers:     map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		ContentType: "application/json", Payload: []byte(`{"total":4250}`), CreatedAt: time.Now(),
	}
	fmt.Println("publish:", sink.Publish(ctx, []*ferryevent.Event{ev})[0])

	resp, err := http.Post(receiver.URL+"/hooks/ferry", "application/json", bytes.NewReader([]byte(`{"total":1}`)))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("unsigned request:", resp.Status)
	// Output:
	// received OrderPlaced for order-42 (seq 1, trace 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01): {"total":4250}
	// publish: <nil>
	// unsigned request: 401 Unauthorized
}

// Verify and DecodeRequest are what Handler is made of: use them for
// another body limit or tolerance, or to answer in your own way.
func ExampleVerify() {
	secrets := []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	hook := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 8<<20) // bound what DecodeRequest reads
		ev, err := ferrywebhook.DecodeRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := ferrywebhook.Verify(secrets, r.Header, ev.Payload, time.Minute, time.Now()); err != nil {
			http.Error(w, "invalid signature", http.StatusUnauthorized)
			return
		}
		fmt.Printf("verified %s %s\n", ev.Type, ev.Key)
		w.WriteHeader(http.StatusNoContent)
	})
	receiver := httptest.NewServer(hook)
	defer receiver.Close()

	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: receiver.URL, Secrets: secrets, MaxBodyBytes: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(context.Background())
	ev := &ferryevent.Event{ID: ferryevent.NewID(), Topic: "files", Key: "file-1", Type: "FileUploaded", Payload: make([]byte, 2<<20), CreatedAt: time.Now()}
	fmt.Println("publish:", sink.Publish(context.Background(), []*ferryevent.Event{ev})[0])
	// Output:
	// verified FileUploaded file-1
	// publish: <nil>
}
