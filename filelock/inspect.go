package filelock

import (
	"context"
	"errors"
	"time"
)

// Holder describes the state of one lock file, for operators.
type Holder struct {
	Held  bool          // a live lock
	Fence uint64        // the last fence granted
	PID   int           // the process that acquired it, when held
	Owner string        // the owner it was acquired for, when held
	Left  time.Duration // time until it expires, when held
}

// Inspect reads the state of the lock on key without changing it.
func (d *Driver) Inspect(ctx context.Context, key string) (Holder, error) {
	var h Holder
	err := d.update(ctx, key, false, func(r *record, now int64) (change, error) {
		h.Fence = r.fence
		if d.live(r, now) {
			h = Holder{Held: true, Fence: r.fence, PID: int(r.pid), Owner: r.owner, Left: time.Duration(r.expires - now)}
		}
		return keep, nil
	})
	if errors.Is(err, errNoFile) {
		return Holder{}, nil
	}
	return h, err
}
