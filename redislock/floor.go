package redislock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the drivers' API.
func init() {
	measure.RegisterRawFloor((*Driver).rawFloor)
	measure.RegisterRawFloor((*FairDriver).rawFloor)
	measure.RegisterRawFloor((*Quorum).rawFloor)
	measure.RegisterStoreTries(func(d *Driver) uint64 { return d.tries.Load() })
	measure.RegisterStoreTries(func(d *FairDriver) uint64 { return d.tries.Load() })
}

// rawRelease is the floors' compare-and-delete.
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// rawFloor is a bare SET key NX PX and a compare-and-delete script
// (EVALSHA) on the Driver's client, what any Redis lock's acquire and
// release cost at least.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	const token = "raw-floor"
	ok, err := d.dep.rdb.SetNX(ctx, key, token, 30*time.Second).Result()
	if err != nil {
		return fmt.Errorf("redislock: raw floor: %w", err)
	}
	if !ok {
		return errors.New("redislock: raw floor: the key is taken")
	}
	n, err := rawRelease.Run(ctx, d.dep.rdb, []string{key}, token).Int64()
	if err != nil {
		return fmt.Errorf("redislock: raw floor: %w", err)
	}
	if n != 1 {
		return errors.New("redislock: raw floor: the key was gone before its delete")
	}
	return nil
}

// rawFloor is the bare Redlock cycle on the Quorum's clients: SET key NX
// PX on every server; once a majority granted, the compare-and-delete
// script on each that granted, after its own SET. It returns when a
// majority of the releases answered, as a quorum's acquire and release
// would; the rest finish in the background (Close waits for them).
func (q *Quorum) rawFloor(ctx context.Context, key string) error {
	closing, done, ok := q.gate.Background()
	if !ok {
		return fmt.Errorf("redislock: quorum: raw floor: %w", backend.ErrClosed)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	stop := context.AfterFunc(closing, cancel)
	value := rand.Text()
	n := len(q.deps)
	set := make(chan bool, n) // a server answered the SET: granted
	decided := make(chan struct{})
	del := make(chan bool, n) // a server answered the release: deleted
	var wg sync.WaitGroup
	for _, dep := range q.deps {
		wg.Go(func() {
			ok, err := dep.rdb.SetNX(rctx, key, value, 10*time.Second).Result()
			ok = ok && err == nil
			set <- ok
			<-decided
			if ok {
				r, err := rawRelease.Run(rctx, dep.rdb, []string{key}, value).Int64()
				ok = err == nil && r == 1
			}
			del <- ok
		})
	}
	granted, answered := 0, 0
	for granted < q.quorum && answered-granted <= n-q.quorum {
		if <-set {
			granted++
		}
		answered++
	}
	close(decided)
	released := 0
	for i := 0; i < n && released < q.quorum; i++ {
		if <-del {
			released++
		}
	}
	go func() {
		wg.Wait()
		stop()
		cancel()
		done()
	}()
	if granted < q.quorum || released < q.quorum {
		return fmt.Errorf("redislock: quorum: raw floor: %d of %d servers granted, %d released, %d needed", granted, n, released, q.quorum)
	}
	return nil
}
