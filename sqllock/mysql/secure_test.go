package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// Tests against the secured instance mariadb-tls: TLS required
// (require_secure_transport), database locker, an admin who may grant.

// secURL is a URL of mariadb-tls for user and password, trusting the
// test CA, with more parameters.
func secURL(t *testing.T, user, pw string, kv ...string) string {
	t.Helper()
	certs := testenv.Secure(t)
	testenv.Require(t, testenv.MySQLTLSAddr())
	u := &url.URL{Scheme: "mysql", User: url.UserPassword(user, pw), Host: testenv.MySQLTLSAddr(), Path: "/locker"}
	return withParams(t, u.String(), append([]string{"ca", certs.CA}, kv...)...)
}

// secAdmin opens mariadb-tls as its admin, for the test's own statements.
func secAdmin(t *testing.T) *sql.DB {
	t.Helper()
	u, err := url.Parse(secURL(t, "admin", testenv.AdminPassword()))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config(u)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// Over TLS, a role with SELECT alone on the tables is refused locks and
// permits with ErrPermission, never retried; SELECT, INSERT, UPDATE and
// DELETE are enough for both, and for the operator's calls. Plain TCP is refused as a permission.
func TestTLSLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := secAdmin(t)
	table := "locks_" + randHex(6)
	t.Cleanup(func() { admin.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_shared`") })
	d, err := Open(ctx, secURL(t, "admin", testenv.AdminPassword(), "lock_table", table))
	if err != nil {
		t.Fatalf("Open over TLS as admin: %v", err)
	}
	d.Close()
	plain := url.URL{Scheme: "mysql", User: url.UserPassword("admin", testenv.AdminPassword()), Host: testenv.MySQLTLSAddr(), Path: "/locker"}
	if d, err := Open(ctx, plain.String()); err == nil {
		d.Close()
		t.Fatal("Open over plain TCP succeeded on a server that requires TLS")
	} else if !errors.Is(err, backend.ErrPermission) || strings.Contains(err.Error(), testenv.AdminPassword()) {
		t.Fatalf("Open over plain TCP = %v, want ErrPermission without the password", err)
	}

	user, pw := "lp_"+randHex(4), randHex(12)
	if _, err := admin.ExecContext(ctx, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, pw)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
	grant := func(what string) {
		for _, tb := range []string{table, table + "_shared"} {
			if _, err := admin.ExecContext(ctx, fmt.Sprintf("GRANT %s ON `locker`.`%s` TO '%s'@'%%'", what, tb, user)); err != nil {
				t.Fatal(err)
			}
		}
	}
	grant("SELECT")
	d, err = Open(ctx, secURL(t, user, pw, "lock_table", table, "create_table", "false"))
	if err != nil {
		t.Fatalf("Open with SELECT alone: %v", err)
	}
	defer d.Close()
	lock := backend.Claim{Key: "lp/x", Token: randHex(16), TTL: time.Minute}
	permit := backend.Claim{Key: "lp/s", Token: randHex(16), TTL: time.Minute, Mode: backend.Permit, Limit: 3}
	for _, c := range []backend.Claim{lock, permit} {
		if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrPermission) || !backend.Permanent(err) {
			t.Fatalf("TryAcquire of a %s with SELECT alone = %v, want ErrPermission", c.Mode, err)
		}
	}
	grant("INSERT, UPDATE, DELETE")
	for _, c := range []backend.Claim{lock, permit} {
		g, err := d.TryAcquire(ctx, c)
		if err != nil {
			t.Fatalf("TryAcquire of a %s with SELECT, INSERT, UPDATE, DELETE: %v", c.Mode, err)
		}
		c.Fence = g.Fence
		if err := d.Refresh(ctx, c); err != nil {
			t.Fatalf("Refresh of a %s: %v", c.Mode, err)
		}
		if err := d.Release(ctx, c); err != nil {
			t.Fatalf("Release of a %s: %v", c.Mode, err)
		}
	}
	// The operator's calls on a semaphore need no more.
	g, err := d.TryAcquire(ctx, permit)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := d.Inspect(ctx, permit.Key, backend.Permit); err != nil || len(st.Holders) != 1 {
		t.Fatalf("Inspect of a semaphore = %+v, %v", st, err)
	}
	if ls, err := d.List(ctx, "lp/", backend.Permit); err != nil || len(ls) != 1 {
		t.Fatalf("List of semaphores = %+v, %v", ls, err)
	}
	if err := d.Resize(ctx, permit.Key, 1); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if st, err := d.Inspect(ctx, permit.Key, backend.Permit); err != nil || st.Limit != 1 {
		t.Fatalf("Inspect of a resized semaphore = %+v, %v; want Limit 1", st, err)
	}
	other := permit
	other.Token = randHex(16)
	if _, err := d.TryAcquire(ctx, other); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a semaphore resized to 1 with 1 held = %v, want ErrNotAcquired", err)
	}
	if err := d.Resize(ctx, permit.Key, 0); err != nil {
		t.Fatalf("Resize to 0: %v", err)
	}
	if _, err := d.Break(ctx, permit.Key, backend.Permit, g.Fence); err != nil {
		t.Fatalf("Break of a permit: %v", err)
	}
}
