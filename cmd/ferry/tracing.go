package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryotel"
)

// hooks are the hooks every relay, client and chain inbox of this process
// gets: the OpenTelemetry tracer when startTracing turned export on.
var hooks []ferryhook.Hook

// tracer is that tracer; nil when traces are not exported.
var tracer *ferryotel.Tracer

// tracedLogs returns h wrapped so that records about an event, or logged
// in a span, carry trace_id and span_id (ferryotel's LogHandler) when
// traces are exported; h itself otherwise.
func tracedLogs(h slog.Handler) slog.Handler {
	if tracer == nil {
		return h
	}
	return tracer.LogHandler(h)
}

// tracingWanted reports whether the standard OpenTelemetry variables ask
// for traces to be exported over OTLP.
func tracingWanted() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// startTracing exports traces over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, configured by the
// standard variables (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT,
// _COMPRESSION, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*),
// and sets hooks so that relays record their publish spans, clients carry
// trace context and chain inboxes record their receive spans, and tracer
// so that the daemons' logs carry trace IDs (tracedLogs). The returned
// function flushes what is buffered; it is a no-op when nothing was
// started.
func startTracing(ctx context.Context) (stop func(), err error) {
	if !tracingWanted() {
		return func() {}, nil
	}
	// The traces' own variable wins over the general one, as the
	// specification says.
	v := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if os.Getenv(v) == "" {
		v = "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	if p := os.Getenv(v); p != "" && p != "http/protobuf" {
		return nil, usagef("%s=%s: ferry exports traces over OTLP/HTTP only; set it to http/protobuf (or unset it) and point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)", v, p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter (OTEL_EXPORTER_OTLP_ENDPOINT=%s): %w", os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), err)
	}
	// The default resource reads OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES; without a service name there, it is ferry.
	res := resource.Default()
	if os.Getenv("OTEL_SERVICE_NAME") == "" && !strings.Contains(os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		if withName, err := resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", "ferry"))); err == nil {
			res = withName
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	tracer = ferryotel.New(ferryotel.WithTracerProvider(tp))
	hooks = []ferryhook.Hook{tracer}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
