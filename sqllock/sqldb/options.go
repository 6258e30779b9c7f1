package sqldb

import "time"

// DefaultTable is the lock table's name unless WithTable gives another;
// the shared table (semaphores and read-write locks) is its name followed
// by "_shared".
const DefaultTable = "locker_locks"

const sharedSuffix = "_shared"

// DefaultRetention is how long a released lock's row stays, where the
// dialect keeps it (MySQL), unless WithRetention says otherwise.
const DefaultRetention = time.Minute

// config is what the options set.
type config struct {
	table     string
	create    bool
	retention time.Duration
}

// Option configures a Driver.
type Option func(*config)

// WithTable sets the name of the lock table (default "locker_locks"). It
// is the URL's lock_table=.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithCreateTable turns the creation of the tables on first use on (the
// default) or off. Turn it off when your migrations run the dialect's
// SchemaSQL; the driver then only checks that the table exists. It is the
// URL's create_table=.
func WithCreateTable(on bool) Option { return func(c *config) { c.create = on } }

// WithRetention sets how long a released (or expired) lock's row stays
// on MySQL, as a tombstone that keeps its fence (default 1 minute): fences
// stay above it even if the server's clock steps back, or an acquisition
// stalls between reading the clock and writing the row, by less than
// that. Each driver deletes older ones every half retention. It is the
// URL's retention=.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

func newConfig(opts []Option) config {
	cfg := config{table: DefaultTable, create: true, retention: DefaultRetention}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}
