package sqldb

import (
	"context"
	"time"
)

// startPurge starts the goroutine that deletes, every half retention,
// the rows free for longer than the retention (tombstones of released
// locks, and expired ones), where the dialect keeps them: so a name
// leaves nothing a retention after its release. Once per driver, from
// ensureSchema; Close stops it.
func (d *Driver) startPurge() {
	if d.sql.purge == "" {
		return
	}
	stop := d.gate.Context()
	if stop.Err() != nil {
		return
	}
	d.purging.Add(1)
	go func() {
		defer d.purging.Done()
		t := time.NewTicker(d.cfg.retention / 2)
		defer t.Stop()
		us := d.cfg.retention.Microseconds()
		for {
			select {
			case <-stop.Done():
				return
			case <-t.C:
			}
			for range 100 { // at most 100,000 rows a round
				ctx, cancel := context.WithTimeout(stop, d.cfg.retention/2)
				n, err := d.exec(ctx, d.sql.purge, us)
				cancel()
				if err != nil || n < 1000 {
					break
				}
			}
		}
	}()
}
