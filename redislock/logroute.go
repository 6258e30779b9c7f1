package redislock

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// go-redis has one logger for the whole process (redis.SetLogger): the
// first driver puts a router in its place that hands each message to the
// loggers of the drivers open now, each once.
var goredisLog = struct {
	once    sync.Once
	mu      sync.Mutex
	loggers map[*slog.Logger]int // open drivers' loggers, with how many use each
}{loggers: map[*slog.Logger]int{}}

type logRouter struct{}

func (logRouter) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	goredisLog.mu.Lock()
	loggers := slices.Collect(maps.Keys(goredisLog.loggers))
	goredisLog.mu.Unlock()
	for _, l := range loggers {
		l.WarnContext(ctx, "redislock: go-redis: "+msg)
	}
}

// installLogRouter puts the router in place, once: before a driver dials,
// so that go-redis's messages of Open's own dial go nowhere else.
func installLogRouter() { goredisLog.once.Do(func() { redis.SetLogger(logRouter{}) }) }

// routeLogs adds l to go-redis's loggers until the returned remove.
func routeLogs(l *slog.Logger) (remove func()) {
	installLogRouter()
	if l == nil || l.Handler() == slog.DiscardHandler {
		return func() {}
	}
	goredisLog.mu.Lock()
	goredisLog.loggers[l]++
	goredisLog.mu.Unlock()
	return sync.OnceFunc(func() {
		goredisLog.mu.Lock()
		defer goredisLog.mu.Unlock()
		if goredisLog.loggers[l]--; goredisLog.loggers[l] <= 0 {
			delete(goredisLog.loggers, l)
		}
	})
}
