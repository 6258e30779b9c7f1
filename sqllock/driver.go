package sqllock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/retry"
	"github.com/lockerhq/locker/sqllock/internal/micros"
)

// Driver keeps locks in a PostgreSQL table, and semaphores and read-write
// locks in a second one. Its methods are safe for concurrent use.
type Driver struct {
	pool    *pgxpool.Pool
	ownPool bool
	cfg     config
	sql     statements
	shared  sharedStatements // semaphores and read-write locks

	// gate guards every call; undos are the cleanups of ambiguous
	// acquisitions, which may outlive their call (see acquireFailed).
	gate  backend.Gate
	undos sync.WaitGroup

	schemaOK atomic.Bool
	schemaMu chan struct{} // held (full) while one call checks or creates the table
	// notifySecret is the table's notification key, read with the table
	// check (set before schemaOK).
	notifySecret string
	sharedOK     atomic.Bool // the shared table was found or made
	// explicitGrant: a grant found its session's isolation other than
	// READ COMMITTED, and grants run in explicit transactions since.
	explicitGrant atomic.Bool
	// prepares: the pool prepares statements (pgx's default QueryExecMode).
	prepares bool

	lis *listener
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

// New returns a driver that uses pool, a pool the caller already has. Lock
// statements run on the pool directly, one autocommitted statement each,
// never inside a transaction of the caller. Close does not close pool. The
// driver also opens one extra connection, with pool's configuration, to
// LISTEN for releases while someone waits.
func New(pool *pgxpool.Pool, opts ...Option) (*Driver, error) {
	if pool == nil {
		return nil, fmt.Errorf("sqllock: New: %w: nil pool", backend.ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newDriver(pool, false, cfg), nil
}

func newDriver(pool *pgxpool.Pool, own bool, cfg config) *Driver {
	d := &Driver{pool: pool, ownPool: own, cfg: cfg, sql: newStatements(cfg.schema, cfg.table), schemaMu: make(chan struct{}, 1)}
	d.prepares = pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	d.shared = newSharedStatements(cfg.schema, cfg.table)
	d.lis = newListener(d)
	return d
}

// TableName returns the quoted, possibly schema-qualified, name of the lock
// table, as it appears in the driver's statements.
func (d *Driver) TableName() string { return d.sql.table }

// begin enters the gate for op, whose context ends at Close, so that
// Close unblocks calls in flight on a pool it did not open (its own pool's
// connections it cuts), and makes the lock table ready, and the shared
// table too for semaphores and read-write locks.
func (d *Driver) begin(ctx context.Context, op string, shared bool) (context.Context, func(), error) {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%s%w", prefix(op), err)
	}
	ensure := d.ensureSchema
	if shared {
		ensure = d.ensureShared
	}
	if err := ensure(ctx); err != nil {
		leave()
		return nil, nil, err
	}
	return ctx, leave, nil
}

// prefix starts the driver's errors of op: "" for the operator's calls,
// whose operation the Client's error names already.
func prefix(op string) string {
	if op == "" {
		return "sqllock: "
	}
	return "sqllock: " + op + ": "
}

// TryAcquire implements backend.Driver with one INSERT ... ON CONFLICT DO
// UPDATE that takes the row only when it is free or expired by the server's
// clock, and bumps its version, the fence.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	if l.Mode != backend.Exclusive {
		return d.tryShared(ctx, l)
	}
	us, err := micros.Of("sqllock: ", l.TTL)
	if err != nil {
		return backend.Grant{}, err
	}
	ctx, leave, err := d.begin(ctx, "acquire", false)
	if err != nil {
		return backend.Grant{}, err
	}
	defer leave()
	var version int64
	// The statement is idempotent for one token (the token's own row is
	// taken again), so it can be retried after a broken connection.
	err = d.retry(ctx, func() error {
		return d.pool.QueryRow(ctx, d.sql.acquire, l.Key, l.Token, l.Owner, us).Scan(&version)
	})
	switch {
	case err == nil:
		return backend.Grant{Fence: uint64(version), TTL: time.Duration(us) * time.Microsecond}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return backend.Grant{}, fmt.Errorf("sqllock: %w", backend.ErrNotAcquired)
	}
	return backend.Grant{}, d.acquireFailed(err, func(ctx context.Context) {
		var live bool
		_ = d.pool.QueryRow(ctx, d.sql.release, l.Key, l.Token, 0, d.sql.channel, d.payload(l.Key)).Scan(&live, nil)
	})
}

// undoTimeout bounds the cleanup of an acquisition that may have committed.
const undoTimeout = 2 * time.Second

// acquireFailed is the error of a grant statement that failed with err.
// When it may have committed, undo removes the token's row (ours alone),
// so that nothing keeps the key held, in the background: the caller, who
// may have given up, does not wait for a store that may not answer. Close
// waits for it and does not cut it short (its context is not the gate's):
// a lock taken as the caller gave up would stay held for its TTL.
func (d *Driver) acquireFailed(err error, undo func(context.Context)) error {
	switch {
	case conflict(err):
		// Still racing after the retries: someone else keeps winning.
		return fmt.Errorf("sqllock: %w (%v)", backend.ErrNotAcquired, err)
	case sqlState(err) != "" && !connLost(err) || pgconn.SafeToRetry(err):
		// The server refused the statement, or it was never sent.
	default:
		d.undos.Add(1)
		go func() {
			defer d.undos.Done()
			ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
			defer cancel()
			undo(ctx)
		}()
	}
	return d.wrap("acquire", err)
}

// Refresh implements backend.Driver: it extends a live lock of l.Token to
// l.TTL from the server's now. The row must also still show l.Fence (when
// set) and l.Owner, as acquired: a row that someone with UPDATE on the
// table rewrote is ErrNotHeld, and the holder learns of the theft.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	if l.Mode != backend.Exclusive {
		return d.RefreshMany(ctx, []backend.Claim{l})[0]
	}
	us, err := micros.Of("sqllock: ", l.TTL)
	if err != nil {
		return err
	}
	ctx, leave, err := d.begin(ctx, "refresh", false)
	if err != nil {
		return err
	}
	defer leave()
	var n int64
	err = d.retry(ctx, func() error {
		tag, err := d.pool.Exec(ctx, d.sql.refresh, l.Key, l.Token, int64(l.Fence), us, l.Owner)
		n = tag.RowsAffected()
		return err
	})
	switch {
	case err != nil:
		return d.wrap("refresh", err)
	case n == 0:
		return fmt.Errorf("sqllock: %w", backend.ErrNotHeld)
	}
	return nil
}

// RefreshMany implements backend.BatchRefresher: one UPDATE over arrays
// refreshes every lock its token still holds, and one more every permit,
// reader and writer.
func (d *Driver) RefreshMany(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	var locks, shared refreshBatch
	for i, c := range claims {
		us, err := micros.Of("sqllock: ", c.TTL)
		if err != nil {
			errs[i] = err
		} else if c.Mode == backend.Exclusive {
			locks.add(i, c, us)
		} else if kind, _, class, err := d.sharedKinds(c); err != nil {
			errs[i] = err
		} else {
			shared.add(i, c, us)
			shared.kinds, shared.classes = append(shared.kinds, kind), append(shared.classes, class)
		}
	}
	if len(locks.pos)+len(shared.pos) == 0 {
		return errs
	}
	ctx, leave, err := d.begin(ctx, "refresh", false)
	if err != nil {
		return failAt(errs, append(locks.pos, shared.pos...), err)
	}
	defer leave()
	d.refreshRows(ctx, errs, locks.pos, d.sql.refreshMany, locks.keys, locks.tokens, locks.fences, locks.ttls, locks.owners)
	if len(shared.pos) == 0 {
		return errs
	}
	if err := d.ensureShared(ctx); err != nil {
		return failAt(errs, shared.pos, err)
	}
	return d.refreshRows(ctx, errs, shared.pos, d.shared.refresh, shared.keys, shared.tokens, shared.fences, shared.ttls, shared.owners, shared.kinds, shared.classes)
}

// refreshBatch holds the arrays that a RefreshMany statement unnests, and
// the index in the claims of each element.
type refreshBatch struct {
	keys, tokens, owners []string
	fences, ttls         []int64
	kinds                []int16 // of the shared table's rows
	classes              []int32 // of their objects' locks
	pos                  []int
}

func (b *refreshBatch) add(i int, c backend.Claim, ttlMicros int64) {
	b.keys, b.tokens, b.owners = append(b.keys, c.Key), append(b.tokens, c.Token), append(b.owners, c.Owner)
	b.fences, b.ttls = append(b.fences, int64(c.Fence)), append(b.ttls, ttlMicros)
	b.pos = append(b.pos, i)
}

// refreshRows runs a RefreshMany statement, which returns the 1-based
// array index of each claim it refreshed, and reports ErrNotHeld for the
// others: errs[pos[j]] is the j-th element's.
func (d *Driver) refreshRows(ctx context.Context, errs []error, pos []int, query string, args ...any) []error {
	if len(pos) == 0 {
		return errs
	}
	done := make([]bool, len(pos))
	err := d.retry(ctx, func() error {
		var i int64
		rows, _ := d.pool.Query(ctx, query, args...) // its error comes back from ForEachRow
		_, err := pgx.ForEachRow(rows, []any{&i}, func() error {
			if i >= 1 && int(i) <= len(done) {
				done[i-1] = true
			}
			return nil
		})
		return err
	})
	if err != nil {
		return failAt(errs, pos, d.wrap("refresh", err))
	}
	for j, i := range pos {
		if !done[j] {
			errs[i] = fmt.Errorf("sqllock: %w", backend.ErrNotHeld)
		}
	}
	return errs
}

// failAt sets err for the claims at pos.
func failAt(errs []error, pos []int, err error) []error {
	for _, i := range pos {
		errs[i] = err
	}
	return errs
}

// Release implements backend.Driver: it frees the token's lock (the row
// goes; a semaphore's or read-write lock's, or a waiting writer's record
// in the shared table) and notifies waiters in the same statement.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	shared := l.Mode != backend.Exclusive
	var kinds []int16
	if shared {
		var err error
		if _, kinds, _, err = d.sharedKinds(l); err != nil {
			return err
		}
	}
	ctx, leave, err := d.begin(ctx, "release", shared)
	if err != nil {
		return err
	}
	defer leave()
	var (
		kind int16
		live bool
	)
	err = d.del(ctx, "release", func() error {
		if shared {
			return d.pool.QueryRow(ctx, d.shared.release, l.Key, l.Token, kinds, int64(l.Fence), d.sql.channel, d.payload(l.Key)).Scan(&kind, &live, nil)
		}
		return d.pool.QueryRow(ctx, d.sql.release, l.Key, l.Token, int64(l.Fence), d.sql.channel, d.payload(l.Key)).Scan(&live, nil)
	})
	switch {
	case err != nil:
		return err
	case kind == kindWaiting:
		// A waiting writer's record, withdrawn: nothing was held.
		return fmt.Errorf("sqllock: %w", backend.ErrNotHeld)
	case !live:
		return fmt.Errorf("sqllock: %w: its TTL had run out", backend.ErrNotHeld)
	}
	return nil
}

// del runs a statement that deletes a row, retried as retry does; its "no
// row" is ErrNotHeld, unless an attempt whose connection broke after it was
// sent may have deleted the row: then we cannot tell, and say so.
func (d *Driver) del(ctx context.Context, op string, f func() error) error {
	var uncertain error
	err := d.retry(ctx, func() error {
		err := f()
		if connLost(err) && !pgconn.SafeToRetry(err) && uncertain == nil {
			uncertain = err
		}
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) && uncertain != nil:
		return d.wrap(op, uncertain)
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("sqllock: %w", backend.ErrNotHeld)
	case err != nil:
		return d.wrap(op, err)
	}
	return nil
}

// payload is the notification payload of key's release (notifyPayload
// with the table's key, read by ensureSchema).
func (d *Driver) payload(key string) string { return notifyPayload(d.notifySecret, key) }

// Close implements backend.Driver. It stops the listener and closes the
// pool if the driver opened it (Open), not one passed to New.
func (d *Driver) Close() error {
	if !d.gate.Close() {
		return fmt.Errorf("sqllock: close: %w", backend.ErrClosed)
	}
	// No call is left to start an undo; each is bounded by undoTimeout.
	d.undos.Wait()
	d.lis.close()
	if d.ownPool {
		d.pool.Close()
	}
	return nil
}

// statementRetry is how long one call resends a statement that a
// concurrent transaction or a broken connection failed: a few quick tries;
// a longer outage is the waiting Client's to ride out, not one call's.
const statementRetry = 30 * time.Millisecond

// retry runs f, again for statementRetry after a conflict with a
// concurrent transaction (conflict) or a broken connection.
func (d *Driver) retry(ctx context.Context, f func() error) error {
	// Every statement can run twice without harm: acquire takes the
	// token's own row again, refresh extends again, and Release treats
	// "not held" after a lost connection as "cannot tell".
	bo := retry.Backoff{Min: time.Millisecond, Max: 8 * time.Millisecond}
	resend := func(err error) bool { return conflict(err) || connLost(err) }
	return retry.Call(ctx, bo, statementRetry, resend, func(context.Context) error { return f() })
}

// permission marks the server's refusal of our credentials or of a
// statement (insufficient_privilege, invalid_password,
// invalid_authorization_specification) as ErrPermission: waiting cannot fix it.
func permission(err error) error {
	switch sqlState(err) {
	case "42501", "28P01", "28000":
		return fmt.Errorf("%w: %w", backend.ErrPermission, err)
	}
	return err
}

// wrap adds the package name and explains an error of the store. Errors
// from pgx never contain the password.
func (d *Driver) wrap(op string, err error) error {
	if d.gate.Closed() {
		return fmt.Errorf("%s%w (%v)", prefix(op), backend.ErrClosed, err)
	}
	if sqlState(err) == codeUndefTable {
		return fmt.Errorf("%stable %s does not exist (run schema.sql or allow create_table): %w", prefix(op), d.sql.table, err)
	}
	return fmt.Errorf("%s%w", prefix(op), permission(err))
}

// ensureSchema creates the table on first use (createIfMissing), or with
// WithCreateTable(false) checks that it exists.
func (d *Driver) ensureSchema(ctx context.Context) error {
	return d.once(ctx, &d.schemaOK, d.prepareSchema)
}

// once runs prepare under the schema lock until it succeeds, and sets ok
// then; after that it costs one atomic load. A channel, not a mutex: a
// call whose context ends while another one checks a table on a dead
// connection returns at once.
func (d *Driver) once(ctx context.Context, ok *atomic.Bool, prepare func(context.Context) error) error {
	if ok.Load() {
		return nil
	}
	select {
	case d.schemaMu <- struct{}{}:
	case <-ctx.Done():
		return d.wrap("schema", context.Cause(ctx))
	}
	defer func() { <-d.schemaMu }()
	if ok.Load() {
		return nil
	}
	if err := prepare(ctx); err != nil {
		return err
	}
	ok.Store(true)
	return nil
}

// prepareSchema makes the lock table and its notification key ready.
func (d *Driver) prepareSchema(ctx context.Context) error {
	if err := d.createIfMissing(ctx, d.sql.table, "schema.sql", d.create); err != nil {
		return err
	}
	var fenced bool
	if err := d.pool.QueryRow(ctx, d.sql.fenced, d.sql.table).Scan(&fenced); err != nil {
		return d.wrap("schema", err)
	}
	if !fenced && !d.cfg.create {
		return fmt.Errorf("sqllock: table %s was made by an older version, and automatic creation is off (create_table=false): run MigrationSQL", d.sql.table)
	}
	if !fenced {
		if err := d.retry(ctx, func() error { return d.migrate(ctx) }); err != nil {
			return fmt.Errorf("sqllock: table %s was made by an older version; migrating it (MigrationSQL, as its owner): %w", d.sql.table, permission(err))
		}
	}
	secret, err := d.loadNotifyKey(ctx)
	if err != nil {
		return d.wrap("notification key", err)
	}
	d.notifySecret = secret
	return nil
}

// loadNotifyKey reads the table's notification key, and makes it first if
// the table has none (made by an older version, or by schema.sql).
func (d *Driver) loadNotifyKey(ctx context.Context) (string, error) {
	var secret *string
	err := d.retry(ctx, func() error {
		return d.pool.QueryRow(ctx, d.sql.notifyKey, notifyKeyName).Scan(&secret)
	})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	if secret != nil && *secret != "" {
		return *secret, nil
	}
	b := make([]byte, 32)
	_, _ = crand.Read(b) // never fails
	err = d.retry(ctx, func() error {
		if _, err := d.pool.Exec(ctx, d.sql.initNotifyKey, notifyKeyName, hex.EncodeToString(b)); err != nil {
			return err
		}
		// Ours, or that of a driver that got there first.
		return d.pool.QueryRow(ctx, d.sql.notifyKey, notifyKeyName).Scan(&secret)
	})
	switch {
	case err != nil:
		return "", err
	case secret == nil || *secret == "":
		return "", errors.New("the notification key row has no key")
	}
	return *secret, nil
}

// createLocked runs f in a transaction that holds the table's creation
// lock, which serializes creation and migration between processes.
func (d *Driver) createLocked(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, d.sql.createLock, d.sql.createLockKey()); err != nil {
			return err
		}
		return f(tx)
	})
}

// migrate runs MigrationSQL on the table, once between processes.
func (d *Driver) migrate(ctx context.Context) error {
	return d.createLocked(ctx, func(tx pgx.Tx) error {
		var fenced bool
		if err := tx.QueryRow(ctx, d.sql.fenced, d.sql.table).Scan(&fenced); err != nil || fenced {
			return err
		}
		_, err := tx.Exec(ctx, d.sql.migrate)
		return err
	})
}

func (d *Driver) create(ctx context.Context) error {
	return d.createLocked(ctx, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, d.sql.exists, d.sql.table).Scan(&exists); err != nil || exists {
			return err
		}
		if d.sql.createSchema != "" {
			var schemaExists bool
			if err := tx.QueryRow(ctx, d.sql.schemaExists, pgx.Identifier{d.cfg.schema}.Sanitize()).Scan(&schemaExists); err != nil {
				return err
			}
			if !schemaExists {
				if _, err := tx.Exec(ctx, d.sql.createSchema); err != nil {
					return err
				}
			}
		}
		_, err := tx.Exec(ctx, d.sql.createTable)
		return err
	})
}

// createIfMissing creates table with create unless it exists, or with
// create_table=false names file, the SQL to run. Processes that create it
// at once are serialized by createLocked, and a concurrent CREATE ... IF
// NOT EXISTS's errors count as success.
func (d *Driver) createIfMissing(ctx context.Context, table, file string, create func(context.Context) error) error {
	var exists bool
	if err := d.pool.QueryRow(ctx, d.sql.exists, table).Scan(&exists); err != nil {
		return d.wrap("schema", err)
	}
	switch {
	case exists:
		return nil
	case !d.cfg.create:
		return fmt.Errorf("sqllock: table %s does not exist, and automatic creation is off (create_table=false): run %s", table, file)
	}
	if err := d.retry(ctx, func() error { return create(ctx) }); err != nil && !createRace(err) {
		return fmt.Errorf("sqllock: create table %s: %w", table, permission(err))
	}
	return nil
}
