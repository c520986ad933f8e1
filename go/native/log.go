package main

import (
	"log/slog"

	"github.com/dynamo-ctx/dynamo-ctx/go/logqueue"
)

// logs receives every log record of the library (slog, and the standard log
// package, which slog.SetDefault redirects); nil if its pipe could not be
// made, and then records are dropped.
var logs *logqueue.Queue

func init() {
	if l, err := logqueue.New(); err == nil {
		logs = l
	}
	slog.SetDefault(slog.New(logs.Handler()))
	slog.Debug("dynamo_ctx native library loaded", "version", version)
}
