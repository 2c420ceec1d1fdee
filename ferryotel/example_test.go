package ferryotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryotel"
)

// One Tracer in the client's, the relay's and the consumer's
// configuration traces an event from the request that emits it to the
// handler that applies it. Here the spans go to an in-memory recorder; in
// a service, to your TracerProvider (ferryotel.New() takes the global one).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := ferryotel.New(ferryotel.WithTracerProvider(tp))

	pool, err := pgxpool.New(ctx, ferrypgtest.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("ferry_otel_example_%d", time.Now().UnixNano())
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		panic(err)
	}
	quiet := slog.New(slog.DiscardHandler)

	client, _ := ferry.NewClient(drv, &ferry.Config{Hooks: []ferryhook.Hook{tr}})
	billing, _ := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Logger: quiet,
		Hooks: []ferryhook.Hook{tr}, Middleware: []ferry.Middleware{tr.Middleware()}})
	billing.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, span := tp.Tracer("billing").Start(ctx, "charge the card") // a child of "process orders"
		defer span.End()
		return nil
	})
	relay, _ := ferry.NewRelay(drv, billing.Sink(), &ferry.RelayConfig{Feed: "billing", Logger: quiet,
		Hooks: []ferryhook.Hook{tr}})
	runCtx, stop := context.WithCancel(ctx)
	go func() { _ = relay.Run(runCtx) }()
	go func() { _ = billing.Run(runCtx) }()

	reqCtx, req := tp.Tracer("shop").Start(ctx, "POST /orders")
	ev := &ferry.Event{Topic: "orders", Key: "order-1", Type: "OrderPlaced", Payload: []byte(`{}`)}
	if err := pgx.BeginFunc(reqCtx, pool, func(tx pgx.Tx) error { return client.EmitTx(reqCtx, tx, ev) }); err != nil {
		panic(err)
	}
	req.End()
	if _, err := ferry.AwaitSettled(reqCtx, drv, "billing", []uuid.UUID{ev.ID}, 10*time.Second, tr); err != nil {
		panic(err)
	}
	stop()
	time.Sleep(200 * time.Millisecond) // let the relay's send span end

	var names []string
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == req.SpanContext().TraceID() {
			names = append(names, s.Name())
		}
	}
	slices.Sort(names)
	fmt.Println(names)
	// Output: [AwaitSettled POST /orders charge the card process orders receive orders send orders]
}
