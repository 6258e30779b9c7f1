package redislock

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
)

// logBuf is a logger's output, safe to read while others write to it.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (lb *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		lb.mu.Lock()
		defer lb.mu.Unlock()
		return lb.b.Write(p)
	}), nil))
}

func (lb *logBuf) String() string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.b.String()
}

func (lb *logBuf) count(s string) int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return strings.Count(lb.b.String(), s)
}

// A go-redis message (a pool that cannot dial) reaches the logger given
// to locker.Open, once although two open drivers use it, and not the
// logger of a driver already closed.
func TestGoRedisLogsReachTheClientLogger(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx := testCtx(t)
	var open, closed logBuf
	openLog := open.logger()
	for range 2 {
		c, err := locker.Open(ctx, "redis://"+testenv.RedisAddr()+"/0", locker.WithLogger(openLog))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	c, err := locker.Open(ctx, "redis://"+testenv.RedisAddr()+"/0", locker.WithLogger(closed.logger()))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String() // closed: every dial is refused
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1, MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatalf("PING to the closed port %s succeeded", addr)
	}
	// go-redis may log from its dialing goroutine after Ping returned.
	want := "failed to dial after 1 attempts: dial tcp " + addr
	deadline := time.Now().Add(5 * time.Second)
	for open.count(want) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a duplicate would follow at once
	if n := open.count(want); n != 1 {
		t.Errorf("the open drivers' logger got %d copies of the dial failure, want 1:\n%s", n, open.b.String())
	}
	if n := open.count("redislock: go-redis: connection pool:"); n < 1 {
		t.Errorf("the message is not marked as go-redis's:\n%s", open.b.String())
	}
	if n := closed.count(addr); n != 0 {
		t.Errorf("a closed driver's logger got the dial failure:\n%s", closed.b.String())
	}
}

// The router hands go-redis's messages to no one once every driver that
// gave a logger is closed.
func TestGoRedisLogsDroppedWithoutDriver(t *testing.T) {
	var lb logBuf
	remove := routeLogs(lb.logger())
	logRouter{}.Printf(context.Background(), "redis: %s", "one")
	remove()
	remove() // idempotent
	logRouter{}.Printf(context.Background(), "redis: %s", "two")
	if lb.count("go-redis: one") != 1 || lb.count("two") != 0 {
		t.Errorf("logged:\n%s", lb.b.String())
	}
}
