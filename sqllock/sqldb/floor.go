package sqldb

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
// table costs at least, on the driver's *sql.DB and through its write
// gate: a plain INSERT of key's row, then its DELETE by token. Nothing
// stays behind.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	if d.sql.floorInsert == "" {
		return fmt.Errorf("%sthe dialect has none", d.prefix("floor"))
	}
	ctx, leave, err := d.begin(ctx, "floor")
	if err != nil {
		return err
	}
	defer leave()
	token := crand.Text() // unique, not secret
	n, err := d.exec(ctx, d.sql.floorInsert, key, token)
	if err != nil {
		return d.wrap("floor", err)
	}
	if n != 1 {
		return fmt.Errorf("%skey %q is taken", d.prefix("floor"), key)
	}
	if _, err := d.exec(ctx, d.sql.floorDelete, key, token); err != nil {
		return d.wrap("floor", err)
	}
	return nil
}
