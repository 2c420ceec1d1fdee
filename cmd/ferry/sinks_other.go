package main

import (
	"context"
	"log/slog"
	"net/url"
)

func openRabbit(context.Context, *url.URL, *slog.Logger) (*openedSink, error) {
	return nil, errSinkNotBuilt
}
