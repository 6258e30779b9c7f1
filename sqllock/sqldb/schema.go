package sqldb

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockerhq/locker/internal/retry"
)

// ensureSchema checks the server and the tables on first use, and
// creates the tables if missing (unless create_table is off). It looks
// before it creates, so that a role without CREATE works on tables made
// by migrations. A channel, not a mutex: a call whose context ends while
// another one checks on a dead connection returns at once.
func (d *Driver) ensureSchema(ctx context.Context) error {
	if d.schemaOK.Load() {
		return nil
	}
	select {
	case d.schemaMu <- struct{}{}:
	case <-ctx.Done():
		return d.wrap("schema", context.Cause(ctx))
	}
	defer func() { <-d.schemaMu }()
	if d.schemaOK.Load() {
		return nil
	}
	if err := d.connect(ctx); err != nil {
		return d.wrap("schema", err)
	}
	if d.dialect.check != nil {
		if err := d.dialect.check(ctx, d.db); err != nil {
			return d.wrap("schema", err)
		}
	}
	if d.dialect.oneWriter && d.dialect.writerKey != nil {
		key, err := d.dialect.writerKey(ctx, d.db)
		if err != nil {
			return d.wrap("schema", err)
		}
		if key != "" {
			d.writer = sharedWriter(key) // read after schemaOK, which orders it
		}
	}
	rows, err := d.db.QueryContext(ctx, d.sql.inspect, "")
	if err == nil {
		err = rows.Close()
	}
	switch {
	case err == nil:
	case d.dialect.classify(err) != errNoTable:
		return d.wrap("schema", err)
	case !d.cfg.create:
		return fmt.Errorf("%stable %s does not exist, and automatic creation is off (create_table=false): run the dialect's SchemaSQL", d.prefix(""), d.table)
	default:
		// The lock table last: another driver that finds it (above)
		// takes both tables as made.
		for _, stmt := range slices.Backward(d.dialect.schema(d.table, d.shared)) {
			if _, err := d.db.ExecContext(ctx, stmt); err != nil {
				return d.wrap("create table", err)
			}
		}
	}
	d.schemaOK.Store(true)
	d.startPurge()
	return nil
}

// switchFor bounds connect's tries: SQLite's busy timeout as
// sqllock/sqlite sets it by default.
const switchFor = 5 * time.Second

// connect opens the pool's first connection, trying again while it fails
// busy. SQLite's drivers run the DSN's pragmas as a connection opens,
// and connections (of any process) that switch a new file to WAL at once
// read it, then write it: SQLite answers the losers SQLITE_BUSY at once,
// without its busy handler. Once the file is in WAL, the pragma has
// nothing to write, and later connections open at once.
func (d *Driver) connect(ctx context.Context) error {
	busy := func(err error) bool { return d.dialect.classify(err) == errBusy }
	return retry.Call(ctx, retry.Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond}, switchFor, busy, d.db.PingContext)
}
