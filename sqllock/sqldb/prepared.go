package sqldb

import (
	"context"
	"database/sql"
	"sync"
)

// prepared holds the statements of every lock cycle (a grant, a release)
// and of the raw floor, each prepared on its first use: the server then
// parses and plans each once per connection, not at every call, and a
// *sql.DB without interpolation sends one round trip per call, not a
// prepare, an execute and a close. The other statements, rarer or of
// varying text (batches), go as text. Not in process (SQLite): its parse
// is the caller's, small next to the commit's fsync, and its in-process
// cancellation (Dialect.inProcess) was measured with text statements.
type prepared struct {
	stmts sync.Map // query → *sql.Stmt
	mu    sync.Mutex
}

// stmt returns query prepared on d's *sql.DB if it is a hot one, or nil.
// A statement that fails to prepare (a ctx that ended, a connection that
// broke) goes as text, and is prepared again at its next use.
func (d *Driver) stmt(ctx context.Context, query string) *sql.Stmt {
	p := &d.prepared
	if s, ok := p.stmts.Load(query); ok {
		return s.(*sql.Stmt)
	}
	if d.dialect.inProcess {
		return nil
	}
	switch query {
	case d.sql.insert, d.sql.release, d.sql.floorInsert, d.sql.floorDelete:
	default:
		return nil
	}
	p.mu.Lock() // one preparation per query
	defer p.mu.Unlock()
	if s, ok := p.stmts.Load(query); ok {
		return s.(*sql.Stmt)
	}
	s, err := d.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	p.stmts.Store(query, s)
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
