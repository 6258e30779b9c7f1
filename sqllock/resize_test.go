package sqllock

import (
	"context"
	"testing"
	"time"

	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// A limit record: see sqltest.ResizeRecord.
func TestResizeRecord(t *testing.T) {
	t.Parallel()
	d, _ := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "ns/resized-record"
	sqltest.ResizeRecord(t, ctx, d, key, func() (n int, err error) {
		err = d.pool.QueryRow(ctx, `SELECT count(*) FROM `+d.shared.table+` WHERE name = $1`, key).Scan(&n)
		return n, err
	})
}
