package sqllock

import "context"

// Resize implements backend.Resizer. The limit is a row of the shared
// table (kind 5, token objects.RecordToken, expiring never), which every
// permit's grant reads in its statement; setting it takes the
// semaphore's lock as a grant does, and notifies as a release does.
// Limit 0 deletes the row.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	ctx, leave, err := d.begin(ctx, "resize", true)
	if err != nil {
		return err
	}
	defer leave()
	err = d.retry(ctx, func() error {
		if limit == 0 {
			_, err := d.pool.Exec(ctx, d.shared.unresize, key)
			return err
		}
		// In an explicit READ COMMITTED transaction: the holders' update
		// sees every grant made before the lock.
		return d.grantBatch(ctx, true, d.shared.semClass, key, d.shared.resize, []any{key, int32(limit), d.sql.channel, d.payload(key)}, nil)
	})
	if err != nil {
		return d.wrap("resize", err)
	}
	return nil
}
