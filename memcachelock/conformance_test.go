package memcachelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
)

// harness runs the conformance suite against one memcached server.
type harness struct {
	addr string
	t    *testing.T // the run's: its cleanup closes the proxies
	mu   sync.Mutex
}

// suiteQuery caps the restart delay: the suite asks for TTLs up to 720h,
// which a server that started less than 720h ago refuses for new names by
// default (restart.go), so cap the delay at a second, which the shared
// server has run for. And the fence counters' retention is short, so that
// ForgetsReleasedNames sees a released name vanish.
const (
	suiteQuery     = "?restart_delay=1s&retention=2s"
	suiteRetention = 2 * time.Second
)

func (h *harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	// Open's first contact is one call within the client's timeout: the
	// suite beside every other package starved the server past the 500ms
	// default once (stress run, "read: i/o timeout" from NewDriver). The
	// suite's drivers are never cut off, so a longer timeout hides no
	// failure the suite looks for; NewCutDriver keeps the default.
	return Open(ctx, "memcache://"+h.addr+suiteQuery+"&timeout=2s")
}

// NewCutDriver implements conformance.Outager: a driver that reaches the
// server through a proxy of its own.
func (h *harness) NewCutDriver(ctx context.Context) (backend.Driver, func(bool), error) {
	p, err := faultproxy.New(h.addr)
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	h.t.Cleanup(func() { p.Close() })
	h.mu.Unlock()
	d, err := Open(ctx, "memcache://"+p.Addr()+suiteQuery)
	if err != nil {
		return nil, nil, err
	}
	return d, func(down bool) {
		p.Refuse(down)
		if down {
			p.Cut()
		}
	}, nil
}

// Residue implements conformance.ResidueCounter: every item the driver
// could have made for key: the lock (a tombstone counts) and its counter,
// and those of the semaphore and the read-write lock.
func (h *harness) Residue(_ context.Context, key string) (int, error) {
	mc := memcache.New(h.addr)
	defer mc.Close()
	items, err := mc.GetMulti(append(objectKeys(key), fenceKey(key), objKey(key, "sl"), objKey(key, "sf"), objKey(key, "rf")))
	return len(items), err
}

// objectKeys names the items that hold or wait for key's lock, semaphore
// and read-write lock.
func objectKeys(key string) []string {
	base := objBase(key)
	keys := append(slotKeys(base, "s", backend.MaxLimit), slotKeys(base, "r", MaxReaders)...)
	return append(keys, lockKey(key), base+"w", base+"q")
}

// Expire deletes the lock's item, as an eviction or a restart would.
func (h *harness) Expire(_ context.Context, key string) error {
	mc := memcache.New(h.addr)
	defer mc.Close()
	if err := mc.Delete(lockKey(key)); err != nil {
		if errors.Is(err, memcache.ErrCacheMiss) {
			return fmt.Errorf("no lock on %q to expire", key)
		}
		return err
	}
	return nil
}

// Entries counts the items of key that hold or wait: memcached keeps no
// per-waiter entries, so this is the lock's own item (a tombstone counts
// too), the semaphore's permits, and the read-write lock's writer, readers
// and waiting writer's record. (The semaphore's limit record stays for the
// retention, as the counters do: Residue counts it.) It lets the suite
// check that failed and cancelled acquisitions leave nothing and that a
// release removes the items.
func (h *harness) Entries(_ context.Context, key string) (int, error) {
	mc := memcache.New(h.addr)
	defer mc.Close()
	items, err := mc.GetMulti(objectKeys(key))
	return len(items), err
}

func (h *harness) Traits() conformance.Traits {
	// memcached counts whole seconds, and frees a lock up to two seconds
	// after its TTL (see expirationMargin); a counter stored for 2s lives
	// at most 2s.
	return conformance.Traits{TTL: time.Second, Granularity: expirationMargin * time.Second, Retention: suiteRetention}
}

func TestConformance(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	conformance.Run(t, &harness{addr: testenv.MemcacheAddr(), t: t})
}
