package sqllock

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lockerhq/locker/backend"
)

// config is what the options set.
type config struct {
	table      string
	schema     string
	create     bool
	listenIdle time.Duration
}

// Option configures a Driver.
type Option func(*config)

// WithTable sets the name of the lock table (default "locker_locks"), at
// most 63 bytes of UTF-8 without control characters. Without WithSchema,
// PostgreSQL finds it through the search_path and creates it in the first
// schema there. It is the URL's lock_table=.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithSchema puts the lock table in the named schema (default: none, the
// search_path decides). With WithCreateTable(true), the default, the schema
// is created if missing. It is the URL's lock_schema=.
func WithSchema(name string) Option { return func(c *config) { c.schema = name } }

// WithCreateTable turns the automatic creation of the table (and of its
// schema) on first use on (the default) or off. Turn it off when your
// migrations run SchemaSQL; the driver then only checks that the table
// exists. It is the URL's create_table=.
func WithCreateTable(on bool) Option { return func(c *config) { c.create = on } }

// WithListenIdle sets how long the connection that listens for release
// notifications stays open after its last subscriber left (default 30s).
func WithListenIdle(d time.Duration) Option { return func(c *config) { c.listenIdle = d } }

// newConfig applies opts to the defaults, and checks the names they give.
func newConfig(opts []Option) (config, error) {
	cfg := config{table: defaultTable, create: true, listenIdle: 30 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	why := identProblem("table", cfg.table, false)
	if why == "" {
		why = identProblem("schema", cfg.schema, true)
	}
	if why != "" {
		return cfg, fmt.Errorf("sqllock: %w: %s", backend.ErrInvalidOption, why)
	}
	return cfg, nil
}

// identProblem says what is wrong with a table or schema name, or "".
func identProblem(what, name string, empty bool) string {
	switch {
	case name == "" && empty:
		return ""
	case name == "" || len(name) > maxIdentLen || !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Sprintf("%s name %q: want 1 to %d bytes of UTF-8 without control characters", what, name, maxIdentLen)
	}
	return ""
}
