package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// URLs rejected before anything is created on disk.
func TestOpenRejectsBadURLs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "locks.db")
	cases := map[string]string{
		"relative, opaque":        "sqlite:locks.db",
		"relative, as a host":     "sqlite://./locks.db",
		"a host":                  "sqlite://localhost" + db,
		"user and password":       "sqlite://u:s3cret@" + db,
		"no path":                 "sqlite://",
		"a directory":             "sqlite://" + dir + "/",
		"a fragment":              "sqlite://" + db + "#x",
		"a NUL byte":              "sqlite://" + db + "%00",
		"unknown parameter":       "sqlite://" + db + "?busy_timout=1s",
		"a pragma":                "sqlite://" + db + "?_pragma=synchronous(OFF)",
		"a password parameter":    "sqlite://" + db + "?password=s3cret",
		"busy_timeout not a time": "sqlite://" + db + "?busy_timeout=5",
		"busy_timeout negative":   "sqlite://" + db + "?busy_timeout=-1s",
		"busy_timeout too long":   "sqlite://" + db + "?busy_timeout=1000h",
		"bad create_table":        "sqlite://" + db + "?create_table=maybe",
		"empty table":             "sqlite://" + db + "?lock_table=",
		"table too long":          "sqlite://" + db + "?lock_table=" + strings.Repeat("t", 60),
		"table sqlite_":           "sqlite://" + db + "?lock_table=sqlite_locks",
		"other scheme":            "file://" + db,
	}
	for what, raw := range cases {
		d, err := Open(context.Background(), raw)
		if err == nil {
			d.Close()
			t.Errorf("%s: Open(%q) succeeded", what, raw)
			continue
		}
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("%s: Open = %v, want ErrInvalidURL", what, err)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", what, err)
		}
		if !strings.HasPrefix(err.Error(), "sqlite: ") {
			t.Errorf("%s: error %q does not start with the package name", what, err)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("bad URLs left %d files in the directory (%s...)", len(left), left[0].Name())
	}
	// An Option of the caller's is an option, not the URL.
	if _, err := Open(context.Background(), "sqlite://"+db, sqldb.WithTable("")); !errors.Is(err, backend.ErrInvalidOption) {
		t.Fatalf("Open with WithTable(\"\") = %v, want ErrInvalidOption", err)
	}
}

// Every accepted form opens the file it names, through the registry too;
// busy_timeout reaches every connection.
func TestOpenForms(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	for _, c := range []struct{ url, file string }{
		{"sqlite://" + dir + "/a.db", "a.db"},
		{"sqlite:" + dir + "/b.db", "b.db"}, // no authority, still absolute
		{"sqlite://" + dir + "/c%3Fd%23e%20f.db?busy_timeout=250ms&lock_table=my%20locks&create_table=true", "c?d#e f.db"},
	} {
		d, err := Open(ctx, c.url)
		if err != nil {
			t.Fatalf("Open(%q): %v", c.url, err)
		}
		claim := backend.Claim{Key: "ns/x", Token: testutil.Token(), TTL: time.Minute}
		if _, err := d.TryAcquire(ctx, claim); err != nil {
			t.Fatalf("TryAcquire on %q: %v", c.url, err)
		}
		if err := d.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, c.file)); err != nil {
			t.Fatalf("%q: %v", c.url, err)
		}
		// The last connection to close removes the WAL: Close closed
		// the database.
		if _, err := os.Stat(filepath.Join(dir, c.file+"-wal")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%q: after Close, the WAL file: %v, want none", c.url, err)
		}
	}
	d, err := Open(ctx, "sqlite://"+dir+"/c%3Fd%23e%20f.db?lock_table=my%20locks&create_table=false")
	if err != nil {
		t.Fatalf("Open with create_table=false on the existing table: %v", err)
	}
	d.Close()
	c, err := locker.Open(ctx, "sqlite://"+dir+"/a.db?namespace=reg&ttl=5s")
	if err != nil {
		t.Fatalf("locker.Open: %v", err)
	}
	l, err := c.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatalf("TryAcquire through the registry: %v", err)
	}
	if l.Fence() == 0 || l.TTL() != 5*time.Second {
		t.Fatalf("fence %d, TTL %v: want a fence and 5s", l.Fence(), l.TTL())
	}
	c.Close()
}

// create_table=false on a file without the table fails at Open, clearly.
func TestOpenWithoutTable(t *testing.T) {
	t.Parallel()
	raw := "sqlite://" + t.TempDir() + "/none.db?create_table=false"
	d, err := Open(context.Background(), raw)
	if err == nil {
		d.Close()
		t.Fatal("Open with create_table=false and no table succeeded")
	}
	if !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Open = %v, want an error saying the table does not exist", err)
	}
}

// A directory that does not exist is an error at Open, not a permission.
func TestOpenMissingDirectory(t *testing.T) {
	t.Parallel()
	d, err := Open(context.Background(), "sqlite://"+t.TempDir()+"/no/such/dir/locks.db")
	if err == nil {
		d.Close()
		t.Fatal("Open in a missing directory succeeded")
	}
	if errors.Is(err, backend.ErrPermission) || errors.Is(err, backend.ErrInvalidURL) {
		t.Fatalf("Open = %v: a missing directory is neither a permission nor a bad URL", err)
	}
}
