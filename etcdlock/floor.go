package etcdlock

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/measure"
	"github.com/lockerhq/locker/internal/retry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// floorTTL is the lease TTL of the raw floor's key: the Client's default.
const floorTTL = 30 * time.Second

// Registered for internal/bench, out of the driver's API.
func init() {
	measure.RegisterRawFloor((*Driver).rawFloor)
	measure.RegisterStoreTries((*Driver).storeTries)
}

// storeTries is the requests that blocking acquisitions sent and that
// could grant them, each the first transaction of an acquisition or a look
// at its place after the entry ahead went (attempts resent included).
func (d *Driver) storeTries() uint64 { return d.tries.Load() }

// rawFloor sends what concurrency.Mutex's uncontended Lock and Unlock
// send, on the driver's client and one of its leases: the put-if-absent
// transaction (with the read of the first owner) and a plain delete. The
// lease, if granted for it, is retired with the driver's idle ones.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("etcdlock: raw floor: %w", err)
	}
	defer done()
	ls, err := d.useLease(ctx, new(retry.Failing), floorTTL)
	if err != nil {
		return fmt.Errorf("etcdlock: raw floor: lease: %w", err)
	}
	defer d.unuse(ls)
	dir := d.prefix + "-floor/" + backend.EscapeKey(key) + "/"
	k := fmt.Sprintf("%s%x", dir, int64(ls.id))
	_, err = d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, "", clientv3.WithLease(ls.id)), clientv3.OpGet(dir, clientv3.WithFirstCreate()...)).
		Else(clientv3.OpGet(k), clientv3.OpGet(dir, clientv3.WithFirstCreate()...)).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdlock: raw floor: %w", err)
	}
	if _, err := d.cli.Delete(ctx, k); err != nil {
		return fmt.Errorf("etcdlock: raw floor: %w", err)
	}
	return nil
}
