package etcdlock

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore is a zapcore.Core that hands the etcd client's log entries to
// a *slog.Logger, at the same level, with their fields as attributes: the
// client logs through zap, the project through slog.
type slogCore struct {
	l      *slog.Logger
	fields []zapcore.Field // from With, oldest first
}

// zapLogger returns a zap.Logger that writes to l.
func zapLogger(l *slog.Logger) *zap.Logger {
	return zap.New(slogCore{l: l})
}

// attemptFailed is the etcd client's message for each failed attempt of a
// request: at Debug, since the driver retries on its own terms and reports
// the outcome once.
const attemptFailed = "retrying of unary invoker failed"

func levelOf(e zapcore.Entry) slog.Level {
	if e.Message == attemptFailed {
		return slog.LevelDebug
	}
	return slogLevel(e.Level)
}

// slogLevel maps zap's Debug, Info, Warn and Error (-1 to 2; DPanic and
// above count as Error) to slog's (-4 to 8, 4 apart).
func slogLevel(lvl zapcore.Level) slog.Level {
	return slog.Level(4 * min(max(int(lvl), -1), 2))
}

func (c slogCore) Enabled(lvl zapcore.Level) bool {
	return c.l.Enabled(context.Background(), slogLevel(lvl))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{l: c.l, fields: append(c.fields[:len(c.fields):len(c.fields)], fields...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.l.Enabled(context.Background(), levelOf(e)) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range slices.Concat(c.fields, fields) {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	c.l.LogAttrs(context.Background(), levelOf(e), "etcd client: "+e.Message, attrs...)
	return nil
}

func (slogCore) Sync() error { return nil }
