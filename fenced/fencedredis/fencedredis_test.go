package fencedredis_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/fencedredis"
	"github.com/lockerhq/locker/fenced/internal/fencetest"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// open opens a resource as a fence key and a list of the writes, in the
// order Redis ran them, on one hash tag.
func open(_ context.Context, id, _ string) (fencetest.Store, func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	tag := "{fenced-" + id + "}"
	s := store{rdb, tag + ":fence", tag + ":log"}
	return s, func() { rdb.Del(context.Background(), s.fk, s.log); rdb.Close() }, nil
}

type store struct {
	rdb     *redis.Client
	fk, log string
}

func (s store) Write(ctx context.Context, who string, fence uint64, bypass bool) error {
	w := who + " " + strconv.FormatUint(fence, 10)
	if bypass {
		return s.rdb.RPush(ctx, s.log, w).Err()
	}
	_, err := fencedredis.Do(ctx, s.rdb, s.fk, fence, "RPUSH", s.log, w)
	return err
}

func (s store) Writes(ctx context.Context) ([]history.Write, error) {
	l, err := s.rdb.LRange(ctx, s.log, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	ws := make([]history.Write, len(l))
	for i, w := range l {
		who, fence, _ := strings.Cut(w, " ")
		ws[i].Who = who
		if ws[i].Fence, err = strconv.ParseUint(fence, 10, 64); err != nil {
			return nil, err
		}
	}
	return ws, nil
}

func TestPausedHolder(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	fencetest.Paused(t, open)
}

func TestOverrunningHolders(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	fencetest.Overrunning(t, open)
}

// Fences above 2^53, where Lua's numbers are not exact, compare exactly;
// bad input is refused before any request.
func TestFences(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx := context.Background()
	s, drop, _ := open(ctx, testutil.RandHex(4), "")
	defer drop()
	rdb, fk, key := s.(store).rdb, s.(store).fk, s.(store).log
	if _, err := fencedredis.Do(ctx, rdb, fk, 1<<62+1, "SET", key, "big"); err != nil {
		t.Fatal(err)
	}
	if _, err := fencedredis.Do(ctx, rdb, fk, 1<<62, "SET", key, "below"); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("2^62 after 2^62+1: %v, want ErrStale", err)
	}
	if v, err := fencedredis.Do(ctx, rdb, fk, 1<<62+1, "GET", key); err != nil || v != "big" {
		t.Fatalf("GET: %v, %v; want big", v, err)
	}
	for _, c := range []struct {
		fk, key string
		fence   uint64
	}{{fk, key, 0}, {"", key, 1}, {fk, "", 1}, {key, key, 1}} {
		if _, err := fencedredis.Do(ctx, rdb, c.fk, c.fence, "SET", c.key, "x"); !errors.Is(err, fenced.ErrInvalid) {
			t.Errorf("Do(%q, %d, SET %q): %v, want ErrInvalid", c.fk, c.fence, c.key, err)
		}
	}
}
