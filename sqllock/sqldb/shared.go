package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/lim"
	"github.com/lockerhq/locker/sqllock/internal/objects"
)

// The shared table keeps semaphores and read-write locks: a row per
// holder (a permit, a reader, a writer) and per waiting writer, and one
// anchor row per object while it has any. Every grant and release of an
// object is a transaction that first locks its anchor row, so that they
// run one at a time per object: counting the holders and inserting one
// with INSERT ... SELECT count(*) would not be atomic under REPEATABLE
// READ or READ COMMITTED (two transactions count the same snapshot and
// both insert). Fences draw from the shared table's AUTO_INCREMENT under
// that lock, so they increase per object in grant order.
const (
	objSemaphore = 1
	objRW        = 2

	kindAnchor  = 0
	kindPermit  = 1
	kindReader  = 2
	kindWriter  = 3
	kindWaiting = 4 // a waiting writer's record (backend.Modal)
	kindLimit   = objects.KindLimit
)

// objectOf returns the object and the holder kind of a claim's mode.
func objectOf(m backend.Mode) (obj, kind int) {
	switch m {
	case backend.Permit:
		return objSemaphore, kindPermit
	case backend.Read:
		return objRW, kindReader
	default:
		return objRW, kindWriter
	}
}

// Modes implements backend.Modal: semaphores and read-write locks where
// the dialect has the shared table's statements.
func (d *Driver) Modes() backend.ModeSet {
	if d.sql.sharedInsert == "" {
		return backend.Modes(backend.Exclusive)
	}
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

// Weighs implements backend.Weigher where the dialect has semaphores: a
// holder's permits are in its lim (see package lim).
func (d *Driver) Weighs() bool { return d.Modes().Has(backend.Permit) }

func (d *Driver) modeOK(m backend.Mode) error {
	if !d.Modes().Has(m) {
		return fmt.Errorf("%s%w: %s claims", d.prefix(""), backend.ErrUnsupported, m)
	}
	return nil
}

// Outcomes of a shared grant that commits without granting.
var (
	errRefused  = errors.New("refused")
	errMismatch = errors.New("limit mismatch")
)

// holder is a live row of an object.
type holder struct {
	token     string
	kind, lim int
}

// grantShared runs the grant's transaction: lock the anchor, drop the
// expired rows and the token's own (a retried grant), judge the live
// ones, and insert the holder; or, for a refused writer, record it as
// waiting. A refusal commits too, and returns errRefused or errMismatch.
func (d *Driver) grantShared(ctx context.Context, c backend.Claim, us int64) (int64, time.Time, error) {
	obj, kind := objectOf(c.Mode)
	packed := 0 // a reader's or writer's lim
	if c.Mode == backend.Permit {
		var err error
		if packed, err = lim.Of(d.prefix(""), c); err != nil {
			return 0, time.Time{}, err
		}
		if c.Token == objects.RecordToken {
			// The limit record's (no client's): its purge would delete
			// the record. Refused, as on PostgreSQL.
			return 0, time.Time{}, errRefused
		}
	}
	if refusal := d.precheck(ctx, c, obj); refusal != nil {
		return 0, time.Time{}, refusal
	}
	var fence int64
	var sent time.Time
	refusal := error(nil)
	err := d.inTx(ctx, true, func(tx on) error {
		sent = time.Now() // past the write gate; the insert reads the clock later
		if _, err := tx.exec(d.sql.sharedAnchor, c.Key, obj); err != nil {
			return err
		}
		if _, err := tx.exec(d.sql.sharedPurge, c.Key, obj, c.Token); err != nil {
			return err
		}
		live, err := liveRows(tx, c.Key, obj)
		if err != nil {
			return err
		}
		if refusal = judge(c, live); refusal != nil {
			if c.Mode == backend.Write && !otherWaiting(c, live) {
				_, err := tx.exec(d.sql.sharedWait, c.Key, obj, c.Token, c.Owner, us)
				return err
			}
			return nil
		}
		if r := resized(live); c.Mode == backend.Permit && r > 0 {
			packed = r + (max(c.Weight, 1)-1)*lim.Step // granted under the record
		}
		res, err := tx.exec(d.sql.sharedInsert, c.Key, obj, c.Token, kind, c.Owner, packed, us)
		if err != nil {
			return err
		}
		fence, err = res.LastInsertId()
		return err
	})
	if err == nil {
		err = refusal
	}
	return fence, sent, err
}

// precheck reads the object's live holders outside any transaction and
// returns the refusal that needs no write: a permit or a reader refused,
// a writer refused while another writer's record waits. Refused attempts,
// the many under contention, then take no anchor lock (nor SQLite's one
// write lock) from the holders' refreshes and releases. A stale read
// only refuses what the next try may grant; any error leaves the
// judgement to the transaction.
func (d *Driver) precheck(ctx context.Context, c backend.Claim, obj int) error {
	rows, err := on{ctx, d, nil}.query(d.sql.sharedRows, c.Key, obj)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var live []holder
	for rows.Next() {
		var h holder
		if rows.Scan(&h.token, &h.kind, &h.lim) != nil {
			return nil
		}
		if h.token != c.Token { // the token's own rows go in the grant
			live = append(live, h)
		}
	}
	if rows.Err() != nil {
		return nil
	}
	if r := judge(c, live); r != nil && (c.Mode != backend.Write || otherWaiting(c, live)) {
		return r
	}
	return nil
}

// judge says whether c may join the live holders of its object: nil, or
// errRefused, or errMismatch. A semaphore's limit record, when it has
// one, is its limit whatever c's.
func judge(c backend.Claim, live []holder) error {
	limit := c.Limit
	r := 0
	if c.Mode == backend.Permit {
		r = resized(live)
	}
	if r > 0 {
		if max(c.Weight, 1) > r {
			return errMismatch
		}
		limit = r
	}
	permits := 0
	for _, h := range live {
		switch {
		case c.Mode == backend.Permit && h.kind == kindPermit:
			held, weight := lim.Split(h.lim)
			if r == 0 && held != c.Limit {
				return errMismatch
			}
			permits += weight
		case c.Mode == backend.Read && (h.kind == kindWriter || h.kind == kindWaiting):
			return errRefused // a writer holds it, or waits: writers first
		case c.Mode == backend.Write && (h.kind == kindWriter || h.kind == kindReader):
			return errRefused
		}
	}
	if c.Mode == backend.Permit && permits+max(c.Weight, 1) > limit {
		return errRefused
	}
	return nil
}

// resized returns the limit of a semaphore's record among its live rows,
// 0 when it has none.
func resized(live []holder) int {
	for _, h := range live {
		if h.kind == kindLimit {
			return h.lim
		}
	}
	return 0
}

// otherWaiting reports a live waiting writer's record of another token.
func otherWaiting(c backend.Claim, live []holder) bool {
	for _, h := range live {
		if h.kind == kindWaiting && h.token != c.Token {
			return true
		}
	}
	return false
}

// liveRows reads the live rows of an object, after the purge.
func liveRows(tx on, key string, obj int) ([]holder, error) {
	rows, err := tx.query(tx.d.sql.sharedRows, key, obj)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []holder
	for rows.Next() {
		var h holder
		if err := rows.Scan(&h.token, &h.kind, &h.lim); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// inTx runs f in a transaction, committed when f returns nil, through
// the write gate (as a grant's or not).
func (d *Driver) inTx(ctx context.Context, grant bool, f func(on) error) error {
	d.prepareTx(ctx)
	unlock, err := d.lockWriter(ctx, grant)
	if err != nil {
		return err
	}
	defer unlock()
	tx, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: d.dialect.txIsolation})
	if err != nil {
		return err
	}
	if err := f(on{ctx, d, tx}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// releaseShared deletes c.Token's holder row (of c's fence unless fence
// is 0), live or not, and for a writer its waiting record, under the
// anchor's lock (see underAnchor). It returns what it found: kindWaiting
// for a withdrawn record, the holder's kind when it was live, 0 when
// nothing (or only an expired row).
func (d *Driver) releaseShared(ctx context.Context, c backend.Claim, fence uint64) (int, error) {
	obj, kind := objectOf(c.Mode)
	found := 0
	err := d.underAnchor(ctx, c.Key, obj, func(tx on) error {
		found = 0
		res, err := tx.exec(d.sql.sharedRelease, c.Key, obj, c.Token, kind, int64(fence), int64(fence))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 1 {
			found = kind
			return nil
		}
		if _, err := tx.exec(d.sql.sharedForget, c.Key, obj, c.Token, kind, int64(fence), int64(fence)); err != nil {
			return err
		}
		if c.Mode == backend.Write {
			res, err := tx.exec(d.sql.sharedForget, c.Key, obj, c.Token, kindWaiting, 0, 0)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 1 {
				found = kindWaiting
			}
		}
		return nil
	})
	return found, err
}

// underAnchor runs f, which deletes rows of key's object obj, in a
// transaction under the object's anchor lock, and then deletes the anchor
// if the object has no row left. Without an anchor the object has no row,
// and f does not run.
func (d *Driver) underAnchor(ctx context.Context, key string, obj int, f func(on) error) error {
	return d.inTx(ctx, false, func(tx on) error {
		rows, err := tx.query(d.sql.sharedLockAnchor, key, obj)
		if err != nil {
			return err
		}
		anchored := rows.Next()
		if err := errors.Join(rows.Err(), rows.Close()); err != nil || !anchored {
			return err
		}
		if err := f(tx); err != nil {
			return err
		}
		var left int
		if rows, err = tx.query(d.sql.sharedCount, key, obj); err != nil {
			return err
		}
		if !rows.Next() {
			return errors.Join(orErr(rows.Err(), sql.ErrNoRows), rows.Close())
		}
		if err := errors.Join(rows.Scan(&left), rows.Close()); err != nil {
			return err
		}
		if left == 0 {
			_, err = tx.exec(d.sql.sharedDrop, key, obj)
		}
		return err
	})
}

// releaseSharedClaim is Release of a permit, a reader or a writer.
func (d *Driver) releaseSharedClaim(ctx context.Context, c backend.Claim) error {
	if err := d.modeOK(c.Mode); err != nil {
		return err
	}
	ctx, leave, err := d.begin(ctx, "release")
	if err != nil {
		return err
	}
	defer leave()
	found, err := d.releaseShared(ctx, c, c.Fence)
	switch {
	case err != nil:
		return d.wrap("release", err)
	case found == 0:
		return fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	case found == kindWaiting:
		// A waiting writer's record, withdrawn: nothing was held; the
		// readers it kept out may go.
		d.hub.notify(c.Key)
		return fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	}
	d.hub.notify(c.Key)
	return nil
}

// refreshShared is Refresh of a permit, a reader or a writer: one UPDATE
// of the token's live row, as for a lock.
func (d *Driver) refreshShared(ctx context.Context, c backend.Claim, us int64) error {
	obj, kind := objectOf(c.Mode)
	n, err := d.exec(ctx, d.sql.sharedRefresh, us, c.Key, obj, c.Token, kind, int64(c.Fence), int64(c.Fence), c.Owner)
	switch {
	case err != nil:
		return d.wrap("refresh", err)
	case n == 0:
		return fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	}
	return nil
}
