package sqllock

import (
	"context"
	crand "crypto/rand"
	"fmt"

	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the driver's API.
func init() {
	measure.RegisterRawFloor((*Driver).rawFloor)
}

// rawFloor is the bare statement pair any acquire+release on the lock
// table costs at least, on the driver's pool:
// INSERT ... ON CONFLICT DO NOTHING of key's row, then its DELETE by token.
// Nothing stays behind (the row is the new one's, deleted by its token).
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	ctx, leave, err := d.begin(ctx, "floor", false)
	if err != nil {
		return err
	}
	defer leave()
	token := crand.Text() // unique, not secret
	tag, err := d.pool.Exec(ctx, d.sql.floorInsert, key, token)
	if err != nil {
		return d.wrap("floor", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("sqllock: floor: key %q is taken", key)
	}
	if _, err := d.pool.Exec(ctx, d.sql.floorDelete, key, token); err != nil {
		return d.wrap("floor", err)
	}
	return nil
}
