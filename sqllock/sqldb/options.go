package sqldb

// DefaultTable is the lock table's name unless WithTable gives another;
// the shared table (semaphores and read-write locks) is its name followed
// by "_shared".
const DefaultTable = "locker_locks"

const sharedSuffix = "_shared"

// config is what the options set.
type config struct {
	table  string
	create bool
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

func newConfig(opts []Option) config {
	cfg := config{table: DefaultTable, create: true}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}
