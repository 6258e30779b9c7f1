package sqldb

import (
	"context"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/objects"
)

// never is the TTL of a limit record, in µs: some 146,000 years, which
// the clock's µs plus it keep within an int64.
const never = int64(1) << 62

// Resize implements backend.Resizer where the dialect has semaphores. The
// limit is a row of the shared table (kind 5, token objects.RecordToken,
// expiring never) among the semaphore's, which every grant reads with
// its holders; it keeps the anchor, so the purge of a name's rows never
// takes it. Setting it, under the anchor's lock, draws it a new fence, so
// that pollers see the semaphore change, and gives the holders the limit;
// limit 0 deletes it, and the anchor if nothing else is left.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	if err := d.modeOK(backend.Permit); err != nil {
		return err
	}
	ctx, leave, err := d.begin(ctx, "resize")
	if err != nil {
		return err
	}
	defer leave()
	forget := func(tx on) error {
		_, err := tx.exec(d.sql.sharedForget, key, objSemaphore, objects.RecordToken, kindLimit, 0, 0)
		return err
	}
	if limit == 0 {
		err = d.underAnchor(ctx, key, objSemaphore, forget)
	} else {
		err = d.inTx(ctx, false, func(tx on) error {
			if _, err := tx.exec(d.sql.sharedAnchor, key, objSemaphore); err != nil {
				return err
			}
			if err := forget(tx); err != nil {
				return err
			}
			if _, err := tx.exec(d.sql.sharedInsert, key, objSemaphore, objects.RecordToken, kindLimit, "", limit, never); err != nil {
				return err
			}
			_, err := tx.exec(d.sql.sharedResize, limit, key, objSemaphore)
			return err
		})
	}
	if err != nil {
		return d.wrap("resize", err)
	}
	if limit > 0 {
		d.hub.notify(key) // a raised limit lets waiters in, as a release
	}
	return nil
}
