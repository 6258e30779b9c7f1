package sqldb

import (
	"context"
	"database/sql"
	"sync"
)

// prepared holds the fixed statements of every lock's and shared
// object's cycle (grants, refreshes, releases) and of the raw floor, each
// prepared on its first use: the database then parses and plans each once
// per connection, not at every call (SQLite's parse, run by the caller,
// took 40% of the CPU of the suite's contended cases, under the write
// gate), and a
// *sql.DB without interpolation sends one round trip per call, not a
// prepare, an execute and a close. So are the statements of lock sets of
// up to hotSet names (see hot). The other statements, rarer or of
// varying text (batches), go as text.
type prepared struct {
	stmts sync.Map // query → *sql.Stmt
	hot   sync.Map // query of a set → struct{}
}

// hotSet is the most names of a set whose statements are prepared: at
// most 4*hotSet statements, for the sets of a few names that programs
// take again and again.
const hotSet = 8

// hot returns the statement of a set of n names, marked to be prepared if
// n is at most hotSet.
func (d *Driver) hot(query string, n int) string {
	if n <= hotSet {
		d.prepared.hot.LoadOrStore(query, struct{}{})
	}
	return query
}

// stmt returns query prepared on d's *sql.DB if it is a hot one, or nil.
// A statement that fails to prepare (a ctx that ended, a connection that
// broke) goes as text, and is prepared again at its next use.
func (d *Driver) stmt(ctx context.Context, query string) *sql.Stmt {
	p := &d.prepared
	if s, ok := p.stmts.Load(query); ok {
		return s.(*sql.Stmt)
	}
	q := &d.sql
	switch query {
	case "":
		return nil
	case q.insert, q.takeover, q.refresh, q.release, q.forget, q.floorInsert, q.floorDelete,
		q.sharedAnchor, q.sharedLockAnchor, q.sharedPurge, q.sharedRows, q.sharedInsert, q.sharedWait,
		q.sharedRelease, q.sharedForget, q.sharedCount, q.sharedDrop, q.sharedRefresh:
	default:
		if _, ok := p.hot.Load(query); !ok {
			return nil
		}
	}
	// No lock held while preparing: a prepare on a dead connection lasts
	// until its caller's ctx ends, and must not hold up calls of other
	// contexts. Two that race both prepare; one statement stays.
	s, err := d.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	if prev, loaded := p.stmts.LoadOrStore(query, s); loaded {
		s.Close()
		return prev.(*sql.Stmt)
	}
	return s
}

// closeStmts closes the prepared statements, once no call runs.
func (d *Driver) closeStmts() {
	d.prepared.stmts.Range(func(q, s any) bool {
		s.(*sql.Stmt).Close()
		d.prepared.stmts.Delete(q)
		return true
	})
}

// on runs statements in tx (on the pool when tx is nil), prepared where
// stmt has them.
type on struct {
	ctx context.Context
	d   *Driver
	tx  *sql.Tx
}

// prep returns query's prepared statement for o, or nil. In a
// transaction, only one prepared before it began (see prepareTx):
// preparing on the pool needs a connection besides the transaction's,
// which a pool of one (SetMaxOpenConns(1), as SQLite's users often have
// it) never frees.
func (o on) prep(query string) *sql.Stmt {
	if o.tx == nil {
		return o.d.stmt(o.ctx, query)
	}
	if s, ok := o.d.prepared.stmts.Load(query); ok {
		return o.tx.StmtContext(o.ctx, s.(*sql.Stmt))
	}
	return nil
}

// prepareTx prepares the statements of the shared table's transactions,
// before one begins (each once, then a lookup).
func (d *Driver) prepareTx(ctx context.Context) {
	q := &d.sql
	for _, query := range [...]string{q.sharedAnchor, q.sharedLockAnchor, q.sharedPurge, q.sharedRows,
		q.sharedInsert, q.sharedWait, q.sharedRelease, q.sharedForget, q.sharedCount, q.sharedDrop} {
		d.stmt(ctx, query)
	}
}

func (o on) exec(query string, args ...any) (sql.Result, error) {
	switch s := o.prep(query); {
	case s != nil:
		return s.ExecContext(o.ctx, args...)
	case o.tx != nil:
		return o.tx.ExecContext(o.ctx, query, args...)
	}
	return o.d.db.ExecContext(o.ctx, query, args...)
}

func (o on) query(query string, args ...any) (*sql.Rows, error) {
	switch s := o.prep(query); {
	case s != nil:
		return s.QueryContext(o.ctx, args...)
	case o.tx != nil:
		return o.tx.QueryContext(o.ctx, query, args...)
	}
	return o.d.db.QueryContext(o.ctx, query, args...)
}
