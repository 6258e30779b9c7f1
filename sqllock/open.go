package sqllock

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
)

const usage = "://[user[:password]@]host[:port][,host2...]/database[?sslmode=verify-full&lock_table=locker_locks&lock_schema=NAME&create_table=true&...pgx parameters]"

func init() {
	for _, scheme := range []string{"postgres", "postgresql"} {
		backend.Register(scheme, backend.OpenerFunc(scheme+usage, func(ctx context.Context, u *url.URL) (*Driver, error) {
			return openURL(ctx, u, nil)
		}))
	}
}

// Our own URL parameters, removed before the rest goes to pgx.
const (
	paramTable  = "lock_table"
	paramSchema = "lock_schema"
	paramCreate = "create_table"
)

// pgxParams are the parameters that pgx itself consumes (pgconn, pgx and
// pgxpool). pgx sends any other to the server as a run-time setting, where
// a misspelt one fails at connect time, or passes silently ("custom.name"),
// or changes what our statements do (default_transaction_isolation,
// session_replication_role...): besides these, we accept only serverParams.
var pgxParams = []string{
	// pgconn
	"host", "port", "database", "user", "password", "passfile", "connect_timeout",
	"sslmode", "sslkey", "sslcert", "sslcertmode", "sslrootcert", "sslnegotiation",
	"sslpassword", "sslsni", "krbspn", "krbsrvname", "target_session_attrs",
	"service", "servicefile", "min_protocol_version", "max_protocol_version",
	"channel_binding", "require_auth",
	// pgx
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
	// pgxpool
	"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
	"pool_max_conn_idle_time", "pool_health_check_period", "pool_max_conn_lifetime_jitter",
	"pool_ping_timeout",
}

// warnSSL logs a connection to a remote server whose sslmode checks nothing:
// disable and allow may send everything in clear, and prefer, pgx's
// default, encrypts without checking who answers.
func warnSSL(log *slog.Logger, u *url.URL) {
	if backend.Loopback(u) || u.Query().Has("host") {
		return // a host= parameter (a socket directory, say): left to pgx
	}
	switch mode := u.Query().Get("sslmode"); mode {
	case "", "disable", "allow", "prefer":
		if mode == "" {
			mode = "prefer (the default)"
		}
		log.Warn("locker: sslmode="+mode+" to a remote server does not check who answers: use sslmode=verify-full", "url", backend.Redacted(u))
	}
}

// serverParams are the run-time settings we let through to the server: they
// name the session or bound it, and cannot change what a lock statement
// means.
var serverParams = []string{
	"application_name", "search_path", "timezone", "options",
	"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
}

// Open connects to PostgreSQL with a URL of the form the package doc
// gives, checks that the server answers, and creates the lock table unless
// create_table=false. Options given here override the URL's (lock_table=
// is WithTable, lock_schema= WithSchema, create_table= WithCreateTable).
// Close closes the pool that Open made.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Driver, error) {
	u, err := backend.ParseURL(rawURL, "postgres", "postgresql")
	if err != nil {
		return nil, fmt.Errorf("sqllock: %w", err)
	}
	return openURL(ctx, u, opts)
}

// openURL is Open for a parsed URL; the registry's opener calls it too.
func openURL(ctx context.Context, u *url.URL, opts []Option) (*Driver, error) {
	warnSSL(backend.Logger(ctx), u)
	p := backend.NewParams(u)
	var urlOpts []Option
	if p.Has(paramTable) {
		name := p.String(paramTable, defaultTable)
		if why := identProblem("table", name, false); why != "" {
			return nil, fmt.Errorf("sqllock: %w: %s", backend.ErrInvalidURL, why)
		}
		urlOpts = append(urlOpts, WithTable(name))
	}
	if p.Has(paramSchema) {
		name := p.String(paramSchema, "")
		if why := identProblem("schema", name, true); why != "" {
			return nil, fmt.Errorf("sqllock: %w: %s", backend.ErrInvalidURL, why)
		}
		urlOpts = append(urlOpts, WithSchema(name))
	}
	if p.Has(paramCreate) {
		urlOpts = append(urlOpts, WithCreateTable(p.Bool(paramCreate, true)))
	}
	for _, name := range slices.Concat(pgxParams, serverParams) {
		p.Has(name)
	}
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("sqllock: %w", err)
	}
	q := u.Query()
	q.Del(paramTable)
	q.Del(paramSchema)
	q.Del(paramCreate)
	pu := *u
	pu.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(pu.String())
	if err != nil {
		return nil, fmt.Errorf("sqllock: %w: %s", backend.ErrInvalidURL, backend.Scrub(parseError(err), u))
	}
	if !q.Has("connect_timeout") && cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = backend.OpenTimeout
	}
	cancelOnServer(cfg)
	return openConfig(ctx, cfg, "", append(urlOpts, opts...))
}

// OpenConfig is Open for a pool configuration built by the caller, e.g.
// with pgxpool.ParseConfig and hooks of its own. The driver owns the pool.
// With pgx's default context handler, an acquisition cancelled as the
// server commits it may stay held for its TTL: Open's pools have the
// server cancel such a statement instead (see cancelOnServer).
func OpenConfig(ctx context.Context, cfg *pgxpool.Config, opts ...Option) (*Driver, error) {
	if cfg == nil {
		return nil, fmt.Errorf("sqllock: OpenConfig: %w: nil config", backend.ErrInvalidOption)
	}
	return openConfig(ctx, cfg, cfg.ConnConfig.Host, opts)
}

// parseError is pgx's reason for refusing a connection string, without the
// string itself, which the caller's error names already.
func parseError(err error) string {
	s := err.Error()
	if rest, ok := strings.CutPrefix(s, "cannot parse `"); ok {
		if i := strings.Index(rest, "`: "); i >= 0 {
			return rest[i+3:]
		}
	}
	return s
}

// openConfig opens a driver on cfg. where names the server in errors; it
// is empty for a URL, which the caller's error names already.
func openConfig(ctx context.Context, cfg *pgxpool.Config, where string, opts []Option) (*Driver, error) {
	// Check the options before dialling anything.
	dcfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	op := ""
	if where != "" {
		op = "open " + where
	}
	// The pool's connections, and the listener's (a copy of its
	// configuration), dial through socks.
	socks := conntrack.New()
	cfg.ConnConfig.DialFunc = socks.Dialer(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s%v", prefix(op), err)
	}
	d := newDriver(pool, true, dcfg)
	// Close cuts the own pool's connections as it begins, so that calls in
	// flight on a dead network return at once: pgx ends connections
	// politely, which there waits up to 15 seconds a connection (see
	// docs/backends/sqllock.md, Cancelled statements and Close).
	context.AfterFunc(d.gate.Context(), socks.Cut)
	ctx, cancel := backend.OpenContext(ctx)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s%w", prefix(op), permission(onceEach(err)))
	}
	if err := d.ensureSchema(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// onceEach drops the repeated lines of pgx's connect error: it lists every
// attempt, and with sslmode=prefer (the default) one address fails twice
// in the same words, once with TLS and once without.
func onceEach(err error) error {
	lines := strings.Split(err.Error(), "\n")
	seen := make(map[string]bool, len(lines))
	kept := lines[:0]
	for _, l := range lines {
		if !seen[l] {
			seen[l] = true
			kept = append(kept, l)
		}
	}
	if len(kept) == len(lines) {
		return err
	}
	return &reworded{msg: strings.Join(kept, "\n"), err: err}
}

// reworded is err with another message; errors.Is and As see err.
type reworded struct {
	msg string
	err error
}

func (r *reworded) Error() string { return r.msg }
func (r *reworded) Unwrap() error { return r.err }
