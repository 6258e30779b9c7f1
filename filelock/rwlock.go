package filelock

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/backend"
)

// tryRW grants a reader or the writer of the read-write lock c.Key
// (backend.Modal). Writers are preferred: a writer refused records itself
// as the waiting writer, and readers are refused while that record lives.
func (d *Driver) tryRW(ctx context.Context, c backend.Claim, record bool) (backend.Grant, error) {
	return d.tryObject(ctx, c, func(o *object, tok [32]byte, now int64) (bool, error) {
		waiting := o.waitExp != 0
		if c.Mode == backend.Read {
			for _, h := range o.holders {
				if h.mode == backend.Write {
					return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
				}
			}
			// The file holds at most MaxLimit holders: more readers wait.
			if waiting && o.waitTok != tok || len(o.holders) >= backend.MaxLimit {
				return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
			}
			return true, nil
		}
		if len(o.holders) > 0 {
			if !record {
				return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
			}
			if waiting && o.waitTok == tok && o.waitExp-now > int64(c.TTL)*3/4 {
				// Renewed only past a quarter of its TTL: a refused try
				// that writes nothing wakes no waiter (a watchTicket watches
				// writes), and the writer tries at least that often.
				return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
			}
			if !waiting || o.waitTok == tok {
				o.waitTok, o.waitExp = tok, now+int64(c.TTL)
				// The record must be written with the refusal.
				return true, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
			}
			return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
		}
		if waiting && o.waitTok == tok {
			o.waitExp, o.waitTok = 0, [32]byte{}
		}
		return true, nil
	})
}
