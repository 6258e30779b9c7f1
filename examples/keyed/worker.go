//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/keyed"
)

// item is a task on the queue.
type item struct {
	ID  int    `json:"id"`
	Key string `json:"key"`
	Seq int    `json:"seq"` // place among its key's tasks, from 1
}

// run is one run of a task, as recorded.
type run struct {
	item
	Proc      string `json:"proc"`
	Take      int    `json:"take"`      // the worker's count of tasks taken, at this one
	Reclaimed bool   `json:"reclaimed"` // taken from a dead worker's processing list
	Fence     uint64 `json:"fence"`
	Start     int64  `json:"start"` // Unix ns
	End       int64  `json:"end"`   // Unix ns; 0: did not finish
}

// record stores a finished run, unless a run of its key with a higher
// fence was recorded already (fences are compared as decimal strings, so
// that any uint64 compares exactly). The run leaves the worker's running
// hash and processing list in the same step: a crash either records it or
// leaves it to be run again.
var record = redis.NewScript(`
local function less(a, b)
	if #a ~= #b then return #a < #b end
	return a < b
end
local last = redis.call('GET', KEYS[1])
if last and less(ARGV[1], last) then
	return redis.error_reply('stale fence ' .. ARGV[1] .. ', after ' .. last)
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
redis.call('LREM', KEYS[5], 1, ARGV[4])
return 1
`)

// work is one worker process: it takes tasks until every task of the run
// is done.
func work(ctx context.Context, cfg config, name string, out io.Writer) error {
	k := keysOf(cfg.run)
	rdb := newRedis(cfg.run, name)
	defer rdb.Close()
	c, err := locker.Open(ctx, lockURL(), namespace(cfg.run), locker.WithDefaultTTL(cfg.ttl))
	if err != nil {
		return err
	}
	defer c.Close()
	ex := keyed.New(c, keyed.TTL(cfg.ttl))
	defer ex.Close()

	beat := func(ctx context.Context) error {
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.SAdd(ctx, k.workers(), name)
			p.Set(ctx, k.alive(name), stamp(), cfg.live)
			return nil
		})
		return err
	}
	if err := beat(ctx); err != nil {
		return err
	}
	beating, stopBeat := context.WithCancel(ctx)
	defer stopBeat()
	go func() {
		t := time.NewTicker(cfg.live / 4)
		defer t.Stop()
		for {
			select {
			case <-beating.Done():
				return
			case <-t.C:
				if err := beat(beating); err != nil && beating.Err() == nil {
					log.Printf("%s: heartbeat: %v", name, err)
				}
			}
		}
	}()

	slots := make(chan struct{}, cfg.prefetch)
	var inflight sync.WaitGroup
	var failed error
	var mu sync.Mutex
	take := 0
	nextReclaim := time.Now()
	for {
		if n, err := finished(ctx, rdb, k); err != nil {
			return err
		} else if n {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			return errors.Join(context.Cause(ctx), failed)
		}
		raw, reclaimed := "", false
		if time.Now().After(nextReclaim) {
			raw, err = reclaim(ctx, rdb, k, name)
			if err != nil {
				return err
			}
			reclaimed = raw != ""
			if !reclaimed {
				nextReclaim = time.Now().Add(cfg.live / 2)
			}
		}
		if !reclaimed {
			raw, err = rdb.BLMove(ctx, k.queue(), k.processing(name), "RIGHT", "LEFT", time.Second).Result()
			if errors.Is(err, redis.Nil) {
				<-slots
				continue
			}
			if err != nil {
				return err
			}
		}
		it, err := parse[item](raw)
		if err != nil {
			return fmt.Errorf("task %q: %w", raw, err)
		}
		take++
		r := run{item: it, Proc: name, Take: take, Reclaimed: reclaimed}
		// One goroutine calls Go in the order the tasks were taken: the
		// Executor runs each key's tasks in that order.
		done := ex.Go(ctx, it.Key, func(ctx context.Context) error { return execute(ctx, rdb, k, cfg, r, raw) })
		inflight.Go(func() {
			defer func() { <-slots }()
			if err := <-done; err != nil {
				// Left in the processing list: it runs again only if this
				// worker dies. The run does not finish, and says why.
				mu.Lock()
				failed = errors.Join(failed, fmt.Errorf("task %d (%s #%d): %w", it.ID, it.Key, it.Seq, err))
				mu.Unlock()
			}
		})
	}
	inflight.Wait()
	if err := ex.Close(); err != nil {
		return err
	}
	st := ex.Stats()
	fmt.Fprintf(out, "%s: ran %d tasks under %d locks, took %d\n", name, st.Tasks, st.Acquisitions, take)
	return failed
}

// finished reports whether every task of the run is done.
func finished(ctx context.Context, rdb *redis.Client, k keys) (bool, error) {
	var total *redis.StringCmd
	var done *redis.IntCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		total, done = p.Get(ctx, k.total()), p.SCard(ctx, k.done())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	n, err := total.Int64()
	if err != nil {
		return false, fmt.Errorf("the run's task count: %w", err)
	}
	return done.Val() >= n, nil
}

// reclaim moves one task from the processing list of a worker whose
// liveness key expired into name's, oldest first; LMOVE hands each task to
// one reclaimer only. It returns "" when no dead worker has one left.
func reclaim(ctx context.Context, rdb *redis.Client, k keys, name string) (string, error) {
	ws, err := rdb.SMembers(ctx, k.workers()).Result()
	if err != nil {
		return "", err
	}
	for _, w := range ws {
		if w == name {
			continue
		}
		if n, err := rdb.Exists(ctx, k.alive(w)).Result(); err != nil || n > 0 {
			if err != nil {
				return "", err
			}
			continue
		}
		raw, err := rdb.LMove(ctx, k.processing(w), k.processing(name), "RIGHT", "LEFT").Result()
		if errors.Is(err, redis.Nil) {
			// Nothing left: forget it (a worker that was only slow
			// registers again at its next heartbeat).
			if err := rdb.SRem(ctx, k.workers(), w).Err(); err != nil {
				return "", err
			}
			continue
		}
		return raw, err
	}
	return "", nil
}

// execute is one task: it runs for cfg.work under the key's lock and
// records the run with the lock's fence.
func execute(ctx context.Context, rdb *redis.Client, k keys, cfg config, r run, raw string) error {
	r.Fence = keyed.LockFromContext(ctx).Fence()
	r.Start = stamp()
	if err := rdb.HSet(ctx, k.running(r.Proc), r.ID, jsonOf(r)).Err(); err != nil {
		return err
	}
	select {
	case <-time.After(cfg.work):
	case <-ctx.Done():
		return context.Cause(ctx) // the lock was lost, or the worker stops
	}
	r.End = stamp()
	return record.Run(ctx, rdb,
		[]string{k.fence(r.Key), k.history(), k.done(), k.running(r.Proc), k.processing(r.Proc)},
		fmt.Sprint(r.Fence), jsonOf(r), r.ID, raw).Err()
}
