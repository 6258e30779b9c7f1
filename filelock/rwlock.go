package filelock

import (
	"context"
	"fmt"
	"slices"

	"github.com/lockerhq/locker/backend"
)

// tryRW grants a reader or the writer of the read-write lock c.Key
// (backend.Modal). Writers are preferred: a writer refused records itself
// as the waiting writer, and readers are refused while that record lives.
func (d *Driver) tryRW(ctx context.Context, c backend.Claim, record bool) (backend.Grant, error) {
	refused := fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
	return d.tryObject(ctx, c, func(o *object, tok [32]byte, now int64) (bool, error) {
		waiting := o.waitExp != 0
		if c.Mode == backend.Read {
			// The file holds at most MaxLimit holders: more readers wait.
			if slices.ContainsFunc(o.holders, func(h holder) bool { return h.mode == backend.Write }) ||
				waiting && o.waitTok != tok || len(o.holders) >= backend.MaxLimit {
				return false, refused
			}
			return true, nil
		}
		if len(o.holders) > 0 {
			// Our record is renewed only past a quarter of its TTL: a
			// refused try that writes nothing wakes no waiter (a ticket
			// watches writes), and the writer tries at least that often.
			if record && (!waiting || o.waitTok == tok && o.waitExp-now <= int64(c.TTL)*3/4) {
				o.waitTok, o.waitExp = tok, now+int64(c.TTL)
				return true, refused // the record is written with the refusal
			}
			return false, refused
		}
		if waiting && o.waitTok == tok {
			o.waitExp, o.waitTok = 0, [32]byte{}
		}
		return true, nil
	})
}
