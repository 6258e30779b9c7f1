package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

const usage = "mysql://[user[:password]@]host[:port]/database[?ca=FILE&cert=FILE&key=FILE&server_name=NAME&lock_table=locker_locks&create_table=true&retention=1m&connect_timeout=10s]"

func init() {
	backend.Register("mysql", backend.OpenerFunc(usage, func(ctx context.Context, u *url.URL) (*sqldb.Driver, error) {
		return openURL(ctx, u, nil)
	}))
}

const defaultPort = "3306"

// Open connects to MySQL or MariaDB with a URL of the form the package doc
// gives, checks that the server answers, and creates the lock table
// unless create_table=false. Options given here override the URL's.
// Close closes the connections Open made.
func Open(ctx context.Context, rawURL string, opts ...sqldb.Option) (*sqldb.Driver, error) {
	u, err := backend.ParseURL(rawURL, "mysql")
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return openURL(ctx, u, opts)
}

// config turns u into go-sql-driver's configuration, field by field
// (never a DSN pasted together, where a password could smuggle in
// parameters), and the engine's options.
func config(u *url.URL) (*gomysql.Config, []sqldb.Option, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("mysql: %w: "+format, append([]any{backend.ErrInvalidURL}, args...)...)
	}
	hosts, err := backend.Hosts(u, defaultPort)
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: %w", err)
	}
	if len(hosts) != 1 {
		return nil, nil, bad("%d hosts: want one", len(hosts))
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, nil, bad("want the database's name as the path (mysql://host/database)")
	}
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return nil, nil, bad("the query does not parse") // u.Query would drop what it cannot read
	}
	p := backend.NewParams(u)
	var opts []sqldb.Option
	if p.Has("lock_table") {
		opts = append(opts, sqldb.WithTable(p.String("lock_table", "")))
	}
	if p.Has("create_table") {
		opts = append(opts, sqldb.WithCreateTable(p.Bool("create_table", true)))
	}
	if p.Has("retention") {
		opts = append(opts, sqldb.WithRetention(p.Duration("retention", sqldb.DefaultRetention)))
	}
	cfg := gomysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", hosts[0], db
	cfg.Timeout = p.Duration("connect_timeout", backend.OpenTimeout)
	cfg.ReadTimeout = p.Duration("read_timeout", 0)
	cfg.WriteTimeout = p.Duration("write_timeout", 0)
	tc, err := p.TLS(false)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: %w", err)
	}
	if cfg.Timeout <= 0 || cfg.ReadTimeout < 0 || cfg.WriteTimeout < 0 {
		return nil, nil, bad("timeouts: want positive durations")
	}
	if tc != nil {
		tc = tc.Clone()
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(hosts[0])
		}
		cfg.TLS = tc
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		pw, ok := u.User.Password()
		if !ok {
			pw = os.Getenv("MYSQL_PWD")
		}
		cfg.Passwd = pw
	}
	// One round trip a statement: placeholders filled in by the driver
	// (escaped for the connection's utf8mb4), not a prepare and an
	// execute each.
	cfg.InterpolateParams = true
	cfg.Params = map[string]string{"wait_timeout": strconv.Itoa(int(waitTimeout / time.Second))}
	return cfg, opts, nil
}

const (
	// maxIdle is how many idle connections Open's pool keeps, and
	// maxIdleTime for how long.
	maxIdle     = 16
	maxIdleTime = time.Minute
)

// waitTimeout is the sessions' wait_timeout, above maxIdleTime: the server
// drops a session silent for longer. A client cut off without a FIN (a
// partition, a host gone) between two statements of a semaphore's or
// read-write lock's transaction leaves it holding the object's anchor
// lock, which every grant of the object waits for, until then; by
// default, 8 hours. A var for the test.
var waitTimeout = 2 * time.Minute

// openURL is Open for a parsed URL; the registry's opener calls it too.
func openURL(ctx context.Context, u *url.URL, opts []sqldb.Option) (*sqldb.Driver, error) {
	cfg, urlOpts, err := config(u)
	if err != nil {
		return nil, err
	}
	log := backend.Logger(ctx)
	warnURL := u
	if cfg.Passwd != "" && !backend.HasPassword(u) {
		w := *u // the password from MYSQL_PWD travels the same way
		w.User = url.UserPassword(cfg.User, "x")
		warnURL = &w
	}
	backend.WarnTransport(log, warnURL, cfg.TLS)
	cfg.Logger = driverLog{log}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w: %s", backend.ErrInvalidURL, backend.Scrub(err.Error(), u))
	}
	db := sql.OpenDB(conn) // dials nothing yet
	// database/sql keeps 2 idle connections by default: with more calls
	// at once, every other call closes its connection and the next dials
	// and authenticates anew (some 50 a second under 16 goroutines).
	// Those a burst opened stay for a minute instead.
	db.SetMaxIdleConns(maxIdle)
	db.SetConnMaxIdleTime(maxIdleTime)
	if _, err := sqldb.New(db, sqldb.MySQL, urlOpts...); err != nil {
		db.Close()
		why, _ := strings.CutPrefix(err.Error(), "mysql: "+backend.ErrInvalidOption.Error()+": ")
		return nil, fmt.Errorf("mysql: %w: %s", backend.ErrInvalidURL, why) // lock_table=
	}
	ctx, cancel := backend.OpenContext(ctx)
	defer cancel()
	// MySQL's messages name users and tables, never a password.
	return sqldb.Open(ctx, db, sqldb.MySQL, append(urlOpts, opts...)...)
}

// driverLog passes go-sql-driver's messages (a connection found broken)
// to the Client's logger, at Debug: the errors they explain reach the
// caller anyway.
type driverLog struct{ log *slog.Logger }

func (l driverLog) Print(v ...any) {
	l.log.Debug("locker: mysql: " + strings.TrimSpace(fmt.Sprint(v...)))
}
