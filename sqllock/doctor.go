package sqllock

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
)

var (
	_ backend.Diagnoser  = (*Driver)(nil)
	_ backend.StoreClock = (*Driver)(nil)
)

// Diagnose implements backend.Diagnoser: durability (a lock row a crash
// forgets while its holder runs lets a second holder in), a standby,
// replication a failover can lose grants to, and the role's rights.
func (d *Driver) Diagnose(ctx context.Context, _ time.Duration) ([]backend.Finding, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqllock: diagnose: %w", err)
	}
	defer done()
	var (
		fsync, syncCommit, fpw, standbys string
		inRecovery, super                bool
		replicas                         int
	)
	err = d.pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('full_page_writes'), current_setting('synchronous_standby_names'), pg_is_in_recovery(),
		(SELECT rolsuper FROM pg_roles WHERE rolname = current_user), (SELECT count(*) FROM pg_stat_replication)`).
		Scan(&fsync, &syncCommit, &fpw, &standbys, &inRecovery, &super, &replicas)
	if err != nil {
		return nil, fmt.Errorf("sqllock: diagnose: %w", err)
	}
	fs := backend.Findings{Check: "postgres."}
	const forgets = "a crash can forget lock rows committed just before it, whose holders still run: the next grant lets a second holder in"
	switch {
	case fsync != "on":
		fs.Add("durability", backend.Unsafe, "fsync "+fsync, forgets, "fsync = on in postgresql.conf")
	case syncCommit == "off":
		fs.Add("durability", backend.Unsafe, "synchronous_commit off", forgets,
			"synchronous_commit = on (or ALTER ROLE <the lock role> SET synchronous_commit = on)")
	case fpw != "on":
		fs.Add("durability", backend.Warning, "full_page_writes "+fpw, "a crash mid-write can leave torn pages in the lock table",
			"full_page_writes = on")
	default:
		fs.Add("durability", backend.Sound, "fsync on, synchronous_commit "+syncCommit, "", "")
	}
	switch {
	case inRecovery:
		fs.Add("replication", backend.Unsafe, "a standby (pg_is_in_recovery)", "a standby refuses writes: no lock can be taken",
			"point the URL at the primary")
	case replicas > 0 && standbys == "":
		fs.Add("replication", backend.Warning, fmt.Sprintf("%d standbys, replicated asynchronously", replicas),
			"a failover to a standby that missed the last grants hands those locks out again while their holders run",
			"synchronous_standby_names (with synchronous_commit on or remote_apply), or accept the loss at failover")
	default:
		fs.Add("replication", backend.Sound, fmt.Sprintf("%d standbys, synchronous_standby_names %q", replicas, standbys), "", "")
	}
	if super {
		fs.Add("role", backend.Warning, "the lock role is a superuser",
			"a leaked lock credential can then read or change every database",
			"a role with only what locking needs: see docs/backends/sqllock.md, Least privilege")
	} else {
		fs.Add("role", backend.Sound, "the lock role is not a superuser", "", "")
	}
	return fs.List, nil
}

// StoreTime implements backend.StoreClock: the server's clock_timestamp().
func (d *Driver) StoreTime(ctx context.Context) (time.Time, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("sqllock: %w", err)
	}
	defer done()
	var t time.Time
	if err := d.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("sqllock: %w", err)
	}
	return t, nil
}
