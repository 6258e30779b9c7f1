package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

var (
	_ backend.Diagnoser  = (*Driver)(nil)
	_ backend.StoreClock = (*Driver)(nil)
)

// Diagnose implements backend.Diagnoser: what would let the database
// forget a lock row while its holder runs, and the credential's rights.
func (d *Driver) Diagnose(ctx context.Context, _ time.Duration) ([]backend.Finding, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: diagnose: %w", d.dialect, err)
	}
	defer done()
	var fs []backend.Finding
	if d.dialect.name == "sqlite" {
		fs, err = diagnoseSQLite(ctx, d.db)
	} else {
		fs, err = diagnoseMySQL(ctx, d.db)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: diagnose: %w", d.dialect, err)
	}
	return fs, nil
}

// maxSilence is the longest wait_timeout the doctor finds sound: the
// mysql:// opener's.
const maxSilence = 2 * time.Minute

const forgets = "a crash can forget lock rows committed just before it, whose holders still run: the next grant lets a second holder in"

func diagnoseMySQL(ctx context.Context, db *sql.DB) ([]backend.Finding, error) {
	fs := backend.Findings{Check: "mysql."}
	var flush, readOnly, idle int
	if err := db.QueryRowContext(ctx, "SELECT @@innodb_flush_log_at_trx_commit, @@read_only, @@session.wait_timeout").Scan(&flush, &readOnly, &idle); err != nil {
		return nil, err
	}
	// A client cut off without a FIN between two statements of a
	// semaphore's or read-write lock's transaction keeps the object's
	// anchor row locked until the server drops its session.
	if limit := int(maxSilence / time.Second); idle > limit {
		fs.Add("wait-timeout", backend.Warning, fmt.Sprintf("the sessions' wait_timeout is %d s", idle),
			"a client cut off in a semaphore's or read-write lock's transaction blocks that object's grants until the server drops its session",
			fmt.Sprintf("wait_timeout of %d s or less for the lock sessions (the mysql:// opener sets %d s), or MariaDB's idle_transaction_timeout", limit, limit))
	} else {
		fs.Add("wait-timeout", backend.Sound, fmt.Sprintf("the sessions' wait_timeout is %d s", idle), "", "")
	}
	if flush != 1 {
		fs.Add("durability", backend.Unsafe, fmt.Sprintf("innodb_flush_log_at_trx_commit %d", flush), forgets,
			"innodb_flush_log_at_trx_commit = 1 (SET GLOBAL, and in my.cnf)")
	} else {
		fs.Add("durability", backend.Sound, "innodb_flush_log_at_trx_commit 1", "", "")
	}
	if readOnly != 0 {
		fs.Add("replication", backend.Unsafe, "read_only is on (a replica?)", "no lock can be taken on a read-only server",
			"point the URL at the primary")
	} else if rows, err := db.QueryContext(ctx, "SHOW SLAVE HOSTS"); err != nil {
		fs.Add("replication", backend.Warning, "cannot list the replicas: "+err.Error(),
			"a failover to a replica that missed the last grants hands those locks out again", "grant the privilege the error names to the doctor's user, or check the replicas by hand")
	} else {
		n := 0
		for rows.Next() {
			n++
		}
		rows.Close()
		if n > 0 {
			fs.Add("replication", backend.Warning, fmt.Sprintf("%d replicas", n),
				"replication is asynchronous unless semi-synchronous: a failover to a replica that missed the last grants hands those locks out again while their holders run",
				"semi-synchronous replication (rpl_semi_sync_master_enabled, wait point AFTER_SYNC), or accept the loss at failover")
		} else {
			fs.Add("replication", backend.Sound, "no replicas", "", "")
		}
	}
	rows, err := db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	wide := ""
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			return nil, err
		}
		if strings.Contains(g, " ON *.*") && (strings.Contains(g, "ALL PRIVILEGES") || strings.Contains(g, "SUPER")) {
			wide = g
		}
	}
	if wide != "" {
		fs.Add("grants", backend.Warning, "the credential has "+strings.SplitN(wide, " TO ", 2)[0],
			"a leaked lock credential can then read or change every database",
			"a user with only what locking needs on its tables: see docs/backends/sqllock.md")
	} else {
		fs.Add("grants", backend.Sound, "the credential's privileges stop at its databases", "", "")
	}
	return fs.List, rows.Err()
}

func diagnoseSQLite(ctx context.Context, db *sql.DB) ([]backend.Finding, error) {
	var sync int
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		return nil, err
	}
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return nil, err
	}
	f := backend.Finding{Check: "sqlite.durability", Level: backend.Sound, What: fmt.Sprintf("synchronous %d, journal_mode %s", sync, mode)}
	switch {
	case sync == 0:
		f.Level, f.Why, f.Fix = backend.Unsafe, "a power loss can forget lock rows committed just before it, whose holders still run", "PRAGMA synchronous = FULL (the sqlite:// opener's setting)"
	case sync == 1:
		f.Level, f.Why, f.Fix = backend.Warning, "a power loss can roll back the last commits of lock rows", "PRAGMA synchronous = FULL (the sqlite:// opener's setting)"
	}
	return []backend.Finding{f}, nil
}

// StoreTime implements backend.StoreClock: MySQL's SYSDATE(6); SQLite runs
// in this process, on this host's clock.
func (d *Driver) StoreTime(ctx context.Context) (time.Time, error) {
	if d.dialect.name == "sqlite" {
		return time.Now(), nil
	}
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", d.dialect, err)
	}
	defer done()
	var s string
	if err := d.db.QueryRowContext(ctx, "SELECT UNIX_TIMESTAMP(SYSDATE(6))").Scan(&s); err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", d.dialect, err)
	}
	sec, frac, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: the server's time %q: %w", d.dialect, s, err)
	}
	frac = (frac + "000000000")[:9]
	ns, _ := strconv.ParseInt(frac, 10, 64)
	return time.Unix(secs, ns), nil
}
