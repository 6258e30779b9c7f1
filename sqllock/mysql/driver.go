package mysql

import (
	"database/sql"
	"errors"

	"github.com/lockerhq/locker/sqllock/sqldb"
)

// Driver is the sqldb engine on a *sql.DB that Open opened, which its
// Close closes too. Every method but Close is the engine's.
type Driver struct {
	*sqldb.Driver
	db *sql.DB
}

// Close implements backend.Driver: it closes the engine, then the
// database connections Open made.
func (d *Driver) Close() error {
	err := d.Driver.Close()
	if err != nil {
		return err // closed already
	}
	return errors.Join(err, d.db.Close())
}
