package sqlite

import (
	"database/sql"

	"github.com/lockerhq/locker/sqllock/sqldb"
)

// Driver is the sqldb driver on the database that Open opened, with all
// its methods; Close closes the database too.
type Driver struct {
	*sqldb.Driver
	db *sql.DB
}

// Close closes the driver, then the database.
func (d *Driver) Close() error {
	err := d.Driver.Close()
	if e := d.db.Close(); err == nil {
		err = e
	}
	return err
}
