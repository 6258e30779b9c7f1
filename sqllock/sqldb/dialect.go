package sqldb

import (
	"context"
	"database/sql"
	"strings"
)

// A Dialect is what the engine knows of one database's SQL: its
// statements and how to read its driver's errors. Use the exported values
// ([MySQL], [SQLite]); the zero Dialect is invalid. Everything else (grant
// logic, modes, fences, inspect, cancellation) is the engine's, shared.
type Dialect struct {
	// name is the database's name, for errors: "mysql", "sqlite".
	name string
	// tables returns the quoted names of the lock table called name and
	// of its shared table (semaphores, read-write locks), or why name
	// cannot be used ("" quoted names then).
	tables func(name string) (lock, shared, why string)
	// schema returns the statements that create the tables lock and
	// shared (quoted) if they are missing, in order: what SchemaSQL
	// prints, and what the engine runs unless create_table is off.
	schema func(lock, shared string) []string
	// statements returns every statement the engine runs on the tables
	// lock and shared (quoted): see statements for each one's arguments.
	statements func(lock, shared string) statements
	// classify says what an error of the database's driver means.
	classify func(error) errKind
	// inProcess: the database runs in the caller's process (SQLite), and
	// its driver stops a statement whose context ends before it returns
	// (sqlite3_interrupt), so that nothing is applied after the call:
	// writes run on the caller's context, with no detached goroutine
	// (see Driver.write).
	inProcess bool
	// oneWriter: the database lets one writer in at a time (SQLite), so
	// that the driver's write statements queue in Go for one another
	// (see Driver.write1); reads do not.
	oneWriter bool
	// writerKey, if set with oneWriter, names the database the driver's
	// db writes to (SQLite: the file's absolute path), so that every
	// driver of this process that writes there queues in Go behind one
	// gate, whatever *sql.DB it uses; "" keeps the driver's own gate.
	// It runs once, with check.
	writerKey func(ctx context.Context, db *sql.DB) (string, error)
	// txIsolation is the isolation level of the shared table's
	// transactions (0: the database's default).
	txIsolation sql.IsolationLevel
	// check, if set, runs once before the first statement: it refuses a
	// server that cannot give the guarantees (too old) with an error
	// wrapping backend.ErrUnsupported.
	check func(ctx context.Context, db *sql.DB) error
}

// SchemaSQL returns the DDL of the lock tables with their default names
// (locker_locks, locker_locks_shared) in this dialect, for migrations: run
// it and open the driver with WithCreateTable(false) (create_table=false).
func (d Dialect) SchemaSQL() string {
	lock, shared, _ := d.tables(DefaultTable)
	return strings.Join(d.schema(lock, shared), ";\n") + ";\n"
}

// String returns the dialect's name.
func (d Dialect) String() string { return d.name }

// errKind is what an error of a statement means to the engine.
type errKind uint8

const (
	// errOther: anything else, e.g. a broken connection: the statement
	// may or may not have been applied.
	errOther errKind = iota
	// errDuplicate: a unique key refused an INSERT (the name is taken).
	// The statement changed nothing.
	errDuplicate
	// errPermission: the server refused the user or the statement
	// (access denied, command denied). Never retried.
	errPermission
	// errBusy: a deadlock, a lock wait timeout, a busy database: the
	// statement changed nothing and may succeed if sent again (the core's
	// backoff does).
	errBusy
	// errNoTable: the table does not exist.
	errNoTable
	// errDeadlock: the database rolled the statement back to break a
	// deadlock with concurrent ones on the same rows. Acquisitions of one
	// name deadlock as a release lets several in at once (InnoDB: each
	// takes a shared lock on the deleted row, then each wants it
	// exclusively); one wins, so a grant that loses is "not acquired".
	errDeadlock
	// errRaised: the statement refused itself, as a set's do where a name
	// is not as they need it (see grantMany), and changed nothing.
	errRaised
)

// statements holds the SQL of one dialect for one pair of tables. Every
// statement takes its arguments positionally ("?"), exactly those listed,
// in order; durations are whole microseconds (int64) and every time is
// judged by the database's clock in the SQL itself. Names and tokens are
// Go strings, owners too ("" for none); fences int64.
type statements struct {
	// insert (name, token, owner, ttl) takes name for token and draws a
	// new fence, which LastInsertId returns: it inserts the name's row,
	// or (where the dialect keeps released rows, see purge) takes it if
	// it is free or token's own; LastInsertId 0, or a duplicate key
	// error, when another token holds it. Autocommitted.
	insert string
	// takeover (name, token) deletes name's row if it has expired or is
	// token's own, so that insert can draw a new fence; RowsAffected says
	// whether it did. "" when insert takes rows itself.
	takeover string
	// refresh (ttl, name, token, fence, fence, owner) extends name's live
	// row to ttl from now if it carries token, fence (any when fence is 0)
	// and owner; RowsAffected 1 when it did, whatever the old expiry.
	refresh string
	// release (name, token, fence, fence) frees name's live row of
	// token (and fence, unless 0), deleting it or leaving a tombstone;
	// RowsAffected 1 when it did.
	release string
	// forget (name, token, fence, fence) frees name's row of token
	// (and fence, unless 0), live or expired: the undo of an acquisition
	// the caller gave up on, and the cleanup after a release that found
	// the lock expired; RowsAffected 1 when it did.
	forget string
	// inspect (name) returns owner, fence and the µs left of name's live
	// row; no row when name is free.
	inspect string
	// list (from, hi, hi, limit) returns name, owner, fence and µs left of
	// the live rows whose name is ≥ from and, unless hi is nil, < hi (a
	// []byte, compared bytewise), sorted by the names' bytes, at most limit.
	list string
	// breakLock (name, fence) frees name's live row of fence;
	// RowsAffected 1 when it did.
	breakLock string
	// purge (retention µs), where released rows stay as tombstones that
	// keep their fence, deletes up to 1000 rows free for longer than the
	// retention; "" where a release deletes the row.
	purge string
	// refreshMany(n) is refresh for n claims at once; its arguments are,
	// for each claim in order, (i, name, token, fence, owner, ttl) where i
	// is the claim's position.
	refreshMany func(n int) string
	// heldMany(n) takes refreshMany's arguments and returns the position
	// i of each claim whose row is live and carries its token, fence
	// (any when 0) and owner: after refreshMany, those it refreshed.
	heldMany func(n int) string
	// fences(n) (the n names, then the same n names again) returns, for
	// each name with live holders (its lock's row, its permits, readers
	// and writers), rows of name, count, the highest fence and the XOR of
	// the fences, which the engine adds up (counts), maxes and XORs per
	// name: what a poller for release wake-ups compares. A tombstone may
	// come as a row of count 0 with its fence.
	fences func(n int) string
	// counter (no arguments) returns one integer that grows at every
	// grant in the tables (their AUTO_INCREMENT counters), so that the
	// poller sees a name freed, taken and freed again between two looks;
	// "" when the dialect has none (the poller then wakes a free name's
	// subscribers at every look).
	counter string
	// The shared table's, for semaphores and read-write locks (see
	// shared.go; "" leaves them out of the driver's Modes). obj is the
	// object (1 semaphore, 2 read-write lock), kind the row's (0 the
	// object's anchor, 1 permit, 2 reader, 3 writer, 4 waiting writer, 5
	// a resized semaphore's limit, which never expires: see resize.go);
	// all but sharedRefresh run in one transaction per grant or release.
	//
	// sharedAnchor (name, obj) makes the object's anchor row if missing
	// and locks it until the transaction ends; sharedLockAnchor (name,
	// obj) locks it if it exists, and returns a row then.
	sharedAnchor, sharedLockAnchor string
	// sharedPurge (name, obj, token) deletes the object's expired rows
	// of kind > 0, and token's.
	sharedPurge string
	// sharedRows (name, obj) returns token, kind and lim of the object's
	// live rows of kind > 0 (under the anchor's lock, a plain read sees
	// every grant and release of the object).
	sharedRows string
	// sharedInsert (name, obj, token, kind, owner, lim, ttl) inserts a
	// holder and draws its fence (LastInsertId).
	sharedInsert string
	// sharedWait (name, obj, token, owner, ttl) records token as the
	// waiting writer until ttl from now (kind 4), or renews its record.
	sharedWait string
	// sharedRelease (name, obj, token, kind, fence, fence) deletes the
	// token's live row of kind (and fence, unless 0); sharedForget (same
	// arguments) deletes it live or expired. RowsAffected says whether.
	sharedRelease, sharedForget string
	// sharedCount (name, obj) returns how many rows of kind > 0 the
	// object has; sharedDrop (name, obj) deletes its anchor.
	sharedCount, sharedDrop string
	// sharedRefresh (ttl, name, obj, token, kind, fence, fence, owner)
	// is refresh for a holder's row.
	sharedRefresh string
	// sharedList (obj, from, hi, hi, from, after, limit) is list for
	// holders: name, kind, owner, fence, lim and µs left of the live
	// holders (kinds 1 to 3) of the objects obj whose name is ≥ from and,
	// unless hi is nil, < hi, after the holder (from, after) in the order
	// of the names' bytes, then fences; at most limit.
	sharedList string
	// sharedBreak (name, obj, fence) deletes the object's live holder of
	// fence (kinds 1 to 3); RowsAffected says whether.
	sharedBreak string
	// sharedResize (limit, name, obj) sets the limit of the object's
	// permits (lim's, keeping their weights: see package lim).
	sharedResize string
	// maxBatch is the most claims refreshMany and heldMany take at once,
	// and names fences (the database's limit on arguments), and the
	// largest set that grantMany and releaseMany take.
	maxBatch int

	// A lock set's (see set.go), of n names in byte order. grantMany(n)
	// (for each claim, name, token, owner, ttl) is insert for every name,
	// all or none: where one is held it fails (errDuplicate or errRaised)
	// having taken none. takeoverMany(n) (the same arguments) is takeover
	// for every name (nil where grantMany takes free rows itself).
	// releaseMany(n) (for each claim, name, token, fence; then the n
	// names again) is release for every name. With returning, grantMany
	// returns rows of name and fence, releaseMany the names it freed.
	// Without, grantMany's LastInsertId is every name's fence, and
	// releaseMany frees all or none: it fails (errRaised) where a name's
	// row is not the claim's live one, and a name with no row leaves
	// RowsAffected short; releasedMany(n) (for each claim, name, fence)
	// then returns the names it freed (their tombstones).
	grantMany, takeoverMany, releaseMany, releasedMany func(n int) string
	returning                                          bool

	// floorInsert (name, token) and floorDelete (name, token) are the
	// bare insert-if-absent and delete of a row that any lock cycle costs
	// at least: lockctl bench's raw floor (floor.go), not used by locks.
	floorInsert, floorDelete string
}
