package redislock

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
)

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
