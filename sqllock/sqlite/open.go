package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // registers the database/sql driver "sqlite"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// Usage is the URL form this package registers.
const Usage = "sqlite:///absolute/path/locks.db[?busy_timeout=5s&lock_table=locker_locks&create_table=true]"

func init() {
	backend.Register("sqlite", backend.OpenerFunc(Usage, func(ctx context.Context, u *url.URL) (*sqldb.Driver, error) {
		return openURL(ctx, u, nil)
	}))
}

// DefaultBusyTimeout is how long a statement waits for another
// connection's write (in this process or another) before it fails with
// SQLITE_BUSY, which the Client retries: the URL's busy_timeout=.
const DefaultBusyTimeout = 5 * time.Second

// Open opens the SQLite database file that rawURL names (see the package
// documentation), creating it and the lock table if missing, and returns
// a driver that owns it: Close closes the database. Options given here
// override the URL's lock_table= and create_table=.
func Open(ctx context.Context, rawURL string, opts ...sqldb.Option) (*sqldb.Driver, error) {
	u, err := backend.ParseURL(rawURL, "sqlite")
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return openURL(ctx, u, opts)
}

// openURL is Open for a parsed URL; the registry's opener calls it too.
// Everything in the URL is checked before the file system is touched.
func openURL(ctx context.Context, u *url.URL, opts []sqldb.Option) (*sqldb.Driver, error) {
	path, err := filePath(u)
	if err != nil {
		return nil, err
	}
	p := backend.NewParams(u)
	busy := p.Duration("busy_timeout", DefaultBusyTimeout)
	var urlOpts []sqldb.Option
	if p.Has("lock_table") {
		urlOpts = append(urlOpts, sqldb.WithTable(p.String("lock_table", "")))
	}
	if p.Has("create_table") {
		urlOpts = append(urlOpts, sqldb.WithCreateTable(p.Bool("create_table", true)))
	}
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	ms := busy.Milliseconds()
	if busy%time.Millisecond != 0 {
		ms++ // SQLite counts whole milliseconds: round up, never to 0
	}
	if ms > math.MaxInt32 {
		return nil, fmt.Errorf("sqlite: %w: parameter busy_timeout=%v: want at most %v, SQLite's limit", backend.ErrInvalidURL, busy, time.Duration(math.MaxInt32)*time.Millisecond)
	}
	// The URL's options alone first, on no database: a bad lock_table=
	// is a bad URL.
	if _, err := sqldb.New(&sql.DB{}, sqldb.SQLite, urlOpts...); err != nil {
		why, _ := strings.CutPrefix(err.Error(), "sqlite: "+backend.ErrInvalidOption.Error()+": ")
		return nil, fmt.Errorf("sqlite: %w: %s", backend.ErrInvalidURL, why)
	}
	// sql.Open only checks its arguments: the first connection opens the
	// file, below.
	db, err := sql.Open("sqlite", dsn(path, ms))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// database/sql keeps 2 idle connections by default: with more calls
	// at once (a writer, readers, the poller), every other call closed
	// its connection and the next opened one anew, which reads the schema
	// and prepares the driver's statements again (a tenth of a loaded
	// process's CPU). Those a burst opened stay for a minute instead.
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(time.Minute)
	// The engine's first connection runs the pragmas, and tries again
	// while it loses the race of connections that switch a new file to
	// WAL at once.
	drv, err := sqldb.Open(ctx, db, sqldb.SQLite, append(urlOpts, opts...)...)
	if err != nil {
		if ferr := fileError(path, err); ferr != nil {
			return nil, ferr
		}
		return nil, err // the engine's, which starts with "sqlite: "
	}
	var mode string
	err = db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
	if err == nil && !strings.EqualFold(mode, "wal") {
		err = fmt.Errorf("journal_mode is %q, not wal: is the file system local?", mode)
	}
	if err == nil {
		// SQLite opens a file it may not write read-only, and says so
		// only at the first write.
		var f *os.File
		if f, err = os.OpenFile(path, os.O_RDWR, 0); err == nil {
			f.Close()
		}
	}
	if err != nil {
		drv.Close()
		return nil, failed(path, err)
	}
	return drv, nil
}

// filePath returns the database file's path in u, or an error wrapping
// ErrInvalidURL. Only an absolute path is accepted: a relative one would
// name a different file in each process whose working directory differs,
// and their locks would silently not exclude each other.
func filePath(u *url.URL) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("sqlite: %w: %s (want sqlite:///absolute/path/locks.db)", backend.ErrInvalidURL, why)
	}
	switch {
	case u.User != nil:
		return "", bad("no user or password: the store is a local file")
	case u.Opaque != "":
		return "", bad("a relative path: it would depend on each process's working directory")
	case u.Host != "":
		return "", bad(fmt.Sprintf("a host (%q): the store is a local file, after three slashes", u.Host))
	case u.Fragment != "":
		return "", bad("a fragment (#)")
	case u.Path == "" || strings.HasSuffix(u.Path, "/"):
		return "", bad("no file name")
	case !filepath.IsAbs(u.Path):
		return "", bad("a relative path")
	case strings.ContainsRune(u.Path, 0):
		return "", bad("a NUL byte in the path")
	}
	return u.Path, nil
}

// dsn is the modernc.org/sqlite data source name for path: an SQLite URI,
// the path percent-encoded, with the pragmas that every connection of
// the pool runs as it opens. busy_timeout first, so that the switch to
// WAL waits for another process's write like every other statement.
// WAL lets readers and one writer work at once, and several processes
// share the file; SQLite's default synchronous=FULL stays, so that a
// granted fence survives a power loss and is never granted again.
func dsn(path string, busyMS int64) string {
	return "file://" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(" + strconv.FormatInt(busyMS, 10) + ")&_pragma=journal_mode(WAL)"
}

// failed explains why Open could not use the file at path: see
// fileError, or else err.
func failed(path string, err error) error {
	if ferr := fileError(path, err); ferr != nil {
		return ferr
	}
	return fmt.Errorf("sqlite: open %s: %w", path, err)
}

// fileError says why Open could not use the file at path, if the file
// system tells: its directory is missing, or this process may not write
// it (an error wrapping ErrPermission); nil otherwise.
func fileError(path string, err error) error {
	if _, serr := os.Stat(filepath.Dir(path)); errors.Is(serr, os.ErrNotExist) {
		return fmt.Errorf("sqlite: open %s: its directory does not exist (%w)", path, err)
	}
	if why := permission(path); why != nil {
		return fmt.Errorf("sqlite: open %s: %w: %w", path, backend.ErrPermission, why)
	}
	return nil
}

// permission says why this process may not write the database file or
// its directory (where the -wal and -shm files live), or nil. SQLite's
// own errors ("unable to open database file", "attempt to write a
// readonly database") do not tell a permission from a missing directory.
func permission(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	switch {
	case err == nil:
		f.Close()
	case !errors.Is(err, os.ErrNotExist):
		return refused(err)
	}
	probe, err := os.CreateTemp(filepath.Dir(path), ".locker-probe-*")
	if err != nil {
		return refused(err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return nil
}

// refused returns err if it is a refusal (permissions, a read-only file
// system), else nil.
func refused(err error) error {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS) {
		return err
	}
	return nil
}
