package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/micros"
)

// Driver keeps locks in a table of a database/sql database. It implements
// backend.Driver, backend.Notifier (in-process), backend.BatchRefresher,
// backend.SetAcquirer, backend.Inspector, backend.Lister, backend.Breaker
// and backend.Modal (semaphores and read-write locks, in a second table).
// Its methods are safe for concurrent use.
type Driver struct {
	db      *sql.DB
	ownDB   bool // Open's: Close closes it
	dialect Dialect
	cfg     config
	sql     statements
	table   string // quoted
	shared  string // quoted

	// gate guards every call; writes are the detached statements of
	// acquisitions and their undos, which may outlive their call (see
	// write).
	gate   backend.Gate
	writes sync.WaitGroup

	writer *writeGate // with Dialect.oneWriter

	purging sync.WaitGroup // the purge goroutine (purge.go)

	schemaOK atomic.Bool
	schemaMu chan struct{} // held (full) while one call checks or creates the table

	hub hub

	prepared prepared
}

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.Notifier       = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
	_ backend.Inspector      = (*Driver)(nil)
	_ backend.Lister         = (*Driver)(nil)
	_ backend.Breaker        = (*Driver)(nil)
	_ backend.Modal          = (*Driver)(nil)
)

// New returns a driver that keeps its locks in db, a database of the
// dialect d (MySQL, SQLite), opened with any database/sql driver. Each
// statement runs on db autocommitted, never inside a transaction of the
// caller. Close does not close db. The tables are created on first use
// unless WithCreateTable(false).
func New(db *sql.DB, d Dialect, opts ...Option) (*Driver, error) {
	if db == nil {
		return nil, fmt.Errorf("sqldb: New: %w: nil *sql.DB", backend.ErrInvalidOption)
	}
	if d.tables == nil {
		return nil, fmt.Errorf("sqldb: New: %w: zero Dialect (use sqldb.MySQL or sqldb.SQLite)", backend.ErrInvalidOption)
	}
	cfg := newConfig(opts)
	table, shared, why := d.tables(cfg.table)
	if why == "" && cfg.retention < time.Second {
		why = fmt.Sprintf("retention %v: want 1s or more", cfg.retention)
	}
	if why != "" {
		return nil, fmt.Errorf("%s: %w: %s", d.name, backend.ErrInvalidOption, why)
	}
	return &Driver{
		db: db, dialect: d, cfg: cfg, sql: d.statements(table, shared),
		table: table, shared: shared, schemaMu: make(chan struct{}, 1), writer: new(writeGate),
	}, nil
}

// Open is New for openers, which made db for the driver alone: it checks
// the server and the tables (creating them unless WithCreateTable(false))
// within ctx, so that a server out of reach, a refused password or a
// missing table fails here, and Close closes db. On an error Open closes
// db.
func Open(ctx context.Context, db *sql.DB, d Dialect, opts ...Option) (*Driver, error) {
	drv, err := New(db, d, opts...)
	if err != nil {
		if db != nil {
			db.Close()
		}
		return nil, err
	}
	drv.ownDB = true
	if err := drv.ensureSchema(ctx); err != nil {
		drv.Close()
		return nil, err
	}
	return drv, nil
}

// TableName returns the quoted name of the lock table, as the driver's
// statements use it.
func (d *Driver) TableName() string { return d.table }

// begin enters the gate for op and makes the tables ready.
func (d *Driver) begin(ctx context.Context, op string) (context.Context, func(), error) {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%s%w", d.prefix(op), err)
	}
	if err := d.ensureSchema(ctx); err != nil {
		leave()
		return nil, nil, err
	}
	return ctx, leave, nil
}

// prefix starts the driver's errors of op with the dialect's name, which
// is what the user opened (mysql://, sqlite://); op is "" for the
// operator's calls, whose operation the Client's error names already.
func (d *Driver) prefix(op string) string {
	if op == "" {
		return d.dialect.name + ": "
	}
	return d.dialect.name + ": " + op + ": "
}

// errHeld is the answer of an acquisition that found the name held.
var errHeld = errors.New("held")

// answered reports the engine's own answers of a write (not acquired,
// a limit mismatch), after which nothing needs undoing.
func answered(err error) bool {
	return errors.Is(err, errHeld) || errors.Is(err, errRefused) || errors.Is(err, errMismatch)
}

// TryAcquire implements backend.Driver: one INSERT, which on MySQL also
// takes a free row (released, expired, the token's own) and draws its new
// fence under the row's lock. Where it does not (Dialect's takeover), an
// INSERT that meets the name's row is followed by a DELETE of that row if
// it expired (or is the token's own) and the INSERT again, so that every
// grant draws a new fence; of two contenders for one expired row, one
// DELETE removes it, the other finds nothing to remove, or its INSERT
// meets the winner's row. Permits, readers and writers take the shared
// table's transaction instead (grantShared), in the same frame.
func (d *Driver) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	var fence int64 // the grant's, known to the undo when the write answered
	var sent time.Time
	grant, undo := d.grant, func(ctx context.Context) error { return d.forgetLive(ctx, c, fence) }
	if c.Mode != backend.Exclusive {
		if err := d.modeOK(c.Mode); err != nil {
			return backend.Grant{}, err
		}
		grant, undo = d.grantShared, func(ctx context.Context) error {
			_, err := d.releaseShared(ctx, c, uint64(fence))
			return err
		}
	}
	us, err := micros.Of(d.prefix(""), c.TTL)
	if err != nil {
		return backend.Grant{}, err
	}
	ctx, leave, err := d.begin(ctx, "acquire")
	if err != nil {
		return backend.Grant{}, err
	}
	defer leave()
	err = d.write(ctx, func(ctx context.Context) error {
		var err error
		fence, sent, err = grant(ctx, c, us)
		return err
	}, undo)
	if err != nil {
		return backend.Grant{}, d.acquireErr(err)
	}
	return backend.Grant{Fence: uint64(fence), TTL: time.Duration(us) * time.Microsecond, Sent: sent}, nil
}

// forgetLive frees c.Token's row of c.Key of fence, the undo of an
// acquisition; when the fence is unknown (0: the write's answer never
// came), that of the live row, read first. A forget the server applies
// late (its answer never came either, and it may land whenever) so frees
// nothing granted since: the Client's wait tries again with the same
// claim, which draws a higher fence, and a forget of any fence would free
// that grant, letting a second holder in.
func (d *Driver) forgetLive(ctx context.Context, c backend.Claim, fence int64) error {
	if fence == 0 {
		st, err := d.inspect(ctx, c.Key)
		if err != nil || !st.Held {
			return err // free, or expired: nothing to undo
		}
		fence = int64(st.Fence)
	}
	_, err := d.write1(ctx, d.sql.forget, c.Key, c.Token, fence, fence)
	d.hub.notify(c.Key)
	return err
}

// acquireErr is the error of an acquisition whose write failed with err.
func (d *Driver) acquireErr(err error) error {
	switch kind := d.dialect.classify(err); {
	case errors.Is(err, errHeld) || errors.Is(err, errRefused) || kind == errDuplicate || kind == errRaised:
		return fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotAcquired)
	case errors.Is(err, errMismatch):
		return fmt.Errorf("%s%w", d.prefix(""), backend.ErrLimitMismatch)
	case kind == errDeadlock:
		return fmt.Errorf("%s%w", d.prefix(""), &backend.NotAcquiredError{Reason: "a concurrent acquisition of the name won a deadlock"})
	}
	return d.wrap("acquire", err)
}

// grant runs TryAcquire's statements and returns the fence, and when the
// statement that took the lock was sent (past the write gate): its TTL
// counts from no earlier.
func (d *Driver) grant(ctx context.Context, c backend.Claim, us int64) (int64, time.Time, error) {
	for took := false; ; took = true {
		res, sent, err := d.writeSent(ctx, d.sql.insert, c.Key, c.Token, c.Owner, us)
		if err == nil {
			fence, err := res.LastInsertId()
			if err == nil && fence <= 0 {
				err = errHeld
			}
			return fence, sent, err
		}
		if took || d.sql.takeover == "" || d.dialect.classify(err) != errDuplicate {
			return 0, sent, err
		}
		if res, err = d.write1(ctx, d.sql.takeover, c.Key, c.Token); err != nil {
			return 0, sent, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return 0, sent, orErr(err, errHeld)
		}
	}
}

// orErr returns err, or def when err is nil.
func orErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// Refresh implements backend.Driver: one UPDATE extends the token's live
// row to c.TTL from the database's now, if it still carries c.Fence and
// c.Owner as acquired (a rewritten row reads as a theft).
func (d *Driver) Refresh(ctx context.Context, c backend.Claim) error {
	if err := d.modeOK(c.Mode); err != nil {
		return err
	}
	us, err := micros.Of(d.prefix(""), c.TTL)
	if err != nil {
		return err
	}
	ctx, leave, err := d.begin(ctx, "refresh")
	if err != nil {
		return err
	}
	defer leave()
	if c.Mode != backend.Exclusive {
		return d.refreshShared(ctx, c, us)
	}
	n, err := d.exec(ctx, d.sql.refresh, us, c.Key, c.Token, int64(c.Fence), int64(c.Fence), c.Owner)
	switch {
	case err != nil:
		return d.wrap("refresh", err)
	case n == 0:
		return fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
	}
	return nil
}

// Release implements backend.Driver: one statement frees the token's live
// row (a tombstone on MySQL), and a second one only when there was none,
// to free the token's expired row (ErrNotHeld all the same). It wakes
// this driver's waiters.
func (d *Driver) Release(ctx context.Context, c backend.Claim) error {
	if c.Mode != backend.Exclusive {
		return d.releaseSharedClaim(ctx, c)
	}
	ctx, leave, err := d.begin(ctx, "release")
	if err != nil {
		return err
	}
	defer leave()
	n, err := d.exec(ctx, d.sql.release, c.Key, c.Token, int64(c.Fence), int64(c.Fence))
	if err != nil {
		return d.wrap("release", err)
	}
	if n == 1 {
		d.hub.notify(c.Key)
		return nil
	}
	if n, err := d.exec(ctx, d.sql.forget, c.Key, c.Token, int64(c.Fence), int64(c.Fence)); err == nil && n == 1 {
		return fmt.Errorf("%s%w: its TTL had run out", d.prefix(""), backend.ErrNotHeld)
	}
	return fmt.Errorf("%s%w", d.prefix(""), backend.ErrNotHeld)
}

// exec runs a write statement and returns the rows it affected.
func (d *Driver) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := d.write1(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// write1 runs one write statement, through the write gate where the
// database lets one writer in at a time (see writeGate).
func (d *Driver) write1(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, _, err := d.writeSent(ctx, query, args...)
	return res, err
}

// writeSent is write1, and returns when the statement was sent.
func (d *Driver) writeSent(ctx context.Context, query string, args ...any) (sql.Result, time.Time, error) {
	grant := query == d.sql.insert || query == d.sql.takeover || query == d.sql.floorInsert
	return d.writeAs(ctx, grant, query, args, nil)
}

// writeAs is writeSent for a grant's statement or not, and reads the rows
// that a statement with RETURNING returns with scan, when it is not nil:
// the write is done when they are.
func (d *Driver) writeAs(ctx context.Context, grant bool, query string, args []any, scan func(*sql.Rows) error) (sql.Result, time.Time, error) {
	unlock, err := d.lockWriter(ctx, grant)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer unlock()
	sent := time.Now()
	o := on{ctx, d, nil}
	if scan == nil {
		res, err := o.exec(query, args...)
		return res, sent, err
	}
	rows, err := o.query(query, args...)
	if err != nil {
		return nil, sent, err
	}
	defer rows.Close()
	return nil, sent, scan(rows)
}

// Close implements backend.Driver. It waits for the calls in flight and
// the undos of abandoned acquisitions, each bounded, and closes the
// *sql.DB given to Open, not one given to New.
func (d *Driver) Close() error {
	if !d.gate.Close() {
		return fmt.Errorf("%s%w", d.prefix("close"), backend.ErrClosed)
	}
	d.writes.Wait()
	d.hub.done.Wait()
	d.purging.Wait()
	d.closeStmts()
	if d.ownDB {
		return d.db.Close()
	}
	return nil
}

// wrap adds the package name and explains an error of the database.
// Database errors name users and tables, never a password.
func (d *Driver) wrap(op string, err error) error {
	if d.gate.Closed() {
		return fmt.Errorf("%s%w (%v)", d.prefix(op), backend.ErrClosed, err)
	}
	switch d.dialect.classify(err) {
	case errPermission:
		return fmt.Errorf("%s%w: %w", d.prefix(op), backend.ErrPermission, err)
	case errNoTable:
		return fmt.Errorf("%stable %s does not exist (run the dialect's SchemaSQL or allow create_table): %w", d.prefix(op), d.table, err)
	}
	return fmt.Errorf("%s%w", d.prefix(op), err)
}
