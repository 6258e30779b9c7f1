package sqllock

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// Tests against the secured instance postgres-tls: TLS only, scram-sha-256,
// superuser admin (testenv.AdminPassword), database locker.

// secURL is a URL of postgres-tls for user (and password, if not empty),
// with sslmode=verify-full against the services CA, plus kv.
func secURL(t testing.TB, user, password string, kv ...string) string {
	t.Helper()
	addr := testenv.PostgresTLSAddr()
	testenv.Require(t, addr)
	certs := testenv.Secure(t)
	u := &url.URL{Scheme: "postgres", Host: addr, Path: "/locker", User: url.User(user)}
	if password != "" {
		u.User = url.UserPassword(user, password)
	}
	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.CA}}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// secAdmin is a pool of postgres-tls's superuser.
func secAdmin(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, secURL(t, "admin", testenv.AdminPassword()))
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// secTable makes a lock table (in a schema of its own) as admin, with its
// notification key, and drops both at cleanup. It returns the schema and
// table names.
func secTable(t testing.TB, admin *pgxpool.Pool) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	schema, table := "sec_"+randHex(4), "locks_"+randHex(4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+quote(schema)+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	d, err := Open(ctx, secURL(t, "admin", testenv.AdminPassword(), paramSchema, schema, paramTable, table))
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	return schema, table
}

// secRole makes a login role with a password, and grants. Each grant is a
// statement with %s where the role goes.
func secRole(t testing.TB, admin *pgxpool.Pool, grants ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	role, password := "lockertest_"+randHex(5), "pw-"+randHex(8)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Its sessions first: a role that is connected cannot be dropped.
		admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		if _, err := admin.Exec(ctx, "DROP OWNED BY "+role); err != nil {
			t.Errorf("drop owned by %s: %v", role, err)
		}
		for range 50 {
			if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+role); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("could not drop role %s", role)
	})
	for _, g := range grants {
		if _, err := admin.Exec(ctx, fmt.Sprintf(g, role)); err != nil {
			t.Fatalf("%s: %v", fmt.Sprintf(g, role), err)
		}
	}
	return role, password
}

// leastGrants are the grants doc.go documents for a table that exists, for
// schema s and table t.
func leastGrants(s, t string) []string {
	qt := newStatements(s, t).table
	return []string{
		"GRANT USAGE ON SCHEMA " + quote(s) + " TO %s",
		"GRANT SELECT ON " + qt + " TO %s",
		"GRANT INSERT ON " + qt + " TO %s",
		"GRANT UPDATE ON " + qt + " TO %s",
		"GRANT DELETE ON " + qt + " TO %s",
	}
}

// TLS and the client certificate come from the URL, in pgx's own
// parameters; plain TCP is refused by the server.
func TestSecureTLSFromURL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := secAdmin(t)
	schema, table := secTable(t, admin)
	certs := testenv.Secure(t)
	raw := secURL(t, "admin", testenv.AdminPassword(), paramSchema, schema, paramTable, table,
		"sslcert", certs.ClientCert, "sslkey", certs.ClientKey)
	c, err := locker.Open(ctx, raw, locker.WithNamespace("sec"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "tls")
	if err != nil {
		t.Fatal(err)
	}
	d := c.Driver().(*Driver)
	var ssl bool
	var dn string
	if err := d.pool.QueryRow(ctx, `SELECT ssl, coalesce(client_dn, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &dn); err != nil {
		t.Fatal(err)
	}
	if !ssl || dn != "/CN=locker" {
		t.Fatalf("pg_stat_ssl: ssl %v, client_dn %q; want TLS with the client certificate CN=locker", ssl, dn)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Without TLS the server's pg_hba refuses: a permission error, at Open.
	start := time.Now()
	_, err = Open(ctx, secURL(t, "admin", testenv.AdminPassword(), "sslmode", "disable"))
	if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), "no encryption") {
		t.Fatalf("Open with sslmode=disable = %v, want ErrPermission saying pg_hba refused no encryption", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refused after %v", took)
	}
	t.Logf("sslmode=disable: %v", err)
}

// A server certificate from another CA, or a client certificate from
// another CA, is refused with an error that says so.
func TestSecureWrongCA(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := testenv.NewCerts(t)
	for _, tc := range []struct {
		name string
		kv   []string
		want string
	}{
		{"server cert of another CA", []string{"sslrootcert", other.CA}, "certificate signed by unknown authority"},
	} {
		start := time.Now()
		_, err := Open(ctx, secURL(t, "admin", testenv.AdminPassword(), tc.kv...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Open = %v, want an error saying %q", tc.name, err, tc.want)
			continue
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: refused after %v", tc.name, took)
		}
		t.Logf("%s: %v", tc.name, err)
	}

	// A client certificate of another CA is not sent at all: Go's TLS
	// client sends only one that a CA the server names signed. The
	// server does not require one, so the session runs without.
	d, err := Open(ctx, secURL(t, "admin", testenv.AdminPassword(), "sslcert", other.ClientCert, "sslkey", other.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var dn *string
	if err := d.pool.QueryRow(ctx, `SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&dn); err != nil || dn != nil {
		t.Fatalf("client_dn %v, %v: want no client certificate", dn, err)
	}
}

// A wrong password, or none, is ErrPermission at Open, at once.
func TestSecureCredentials(t *testing.T) {
	// No t.Parallel: t.Setenv keeps PGPASSWORD out of the "no password" case.
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGPASSFILE", "/nonexistent")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct{ name, user, password string }{
		{"wrong password", "admin", "not-the-password"},
		{"no password", "admin", ""},
		{"unknown user", "nobody_" + randHex(4), "whatever"},
	} {
		start := time.Now()
		c, err := locker.Open(ctx, secURL(t, tc.user, tc.password))
		if err == nil {
			c.Close()
			t.Errorf("%s: Open succeeded", tc.name)
			continue
		}
		took := time.Since(start)
		if !errors.Is(err, locker.ErrPermission) {
			t.Errorf("%s: Open = %v, want ErrPermission", tc.name, err)
		}
		if took > time.Second {
			t.Errorf("%s: refused after %v, want at once", tc.name, took)
		}
		t.Logf("%s (%v): %v", tc.name, took.Round(time.Millisecond), err)
	}
}

// The documented grants are enough for everything: acquire, refresh,
// release, a waiter woken by the notification, the operator's calls on a
// lock and a semaphore, on tables admin created, without
// create_table=false. One grant less is ErrPermission at once.
func TestSecureLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := secAdmin(t)
	schema, table := secTable(t, admin)
	grants := leastGrants(schema, table)
	shared := newSharedStatements(schema, table)
	if _, err := admin.Exec(ctx, shared.create); err != nil {
		t.Fatal(err)
	}
	all := slices.Clone(grants)
	for _, g := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
		all = append(all, "GRANT "+g+" ON "+shared.table+" TO %s")
	}
	role, pw := secRole(t, admin, all...)
	raw := secURL(t, role, pw, paramSchema, schema, paramTable, table)

	c, err := locker.Open(ctx, raw, locker.WithNamespace("least"))
	if err != nil {
		t.Fatalf("Open with the documented grants: %v", err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "a", locker.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// The batch refresh, as the watchdog sends it.
	d := c.Driver().(*Driver)
	if errs := d.RefreshMany(ctx, []backend.Claim{{Key: backend.Key("least", "a"), Token: string(l.Token()), Fence: l.Fence(), TTL: 2 * time.Second, Owner: l.Label()}}); errs[0] != nil {
		t.Fatalf("RefreshMany: %v", errs[0])
	}

	// A waiter of another driver of the same role hears the release.
	w, err := Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ch, unsub, err := w.Subscribe(ctx, backend.Key("least", "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer unsub()
	drainWakes(w, ch)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter heard no notification of the release")
	}
	// The operator's calls need no more than the same grants.
	b, err := c.Acquire(ctx, "b", locker.Owner("op"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx, "b"); err != nil || !st.Held || st.Owner != "op" {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	if ls, err := c.List(ctx, ""); err != nil || len(ls) != 1 || ls[0].Name != "b" {
		t.Fatalf("List = %+v, %v", ls, err)
	}
	if _, err := c.ForceRelease(ctx, "b", b.Fence()); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	sem := locker.Semaphore(2)
	p, err := c.Acquire(ctx, "s", sem, locker.Owner("op"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx, "s", sem); err != nil || len(st.Holders) != 1 || st.Holders[0].Owner != "op" {
		t.Fatalf("Inspect of a semaphore = %+v, %v", st, err)
	}
	if ls, err := c.List(ctx, "", sem); err != nil || len(ls) != 1 || ls[0].Name != "s" {
		t.Fatalf("List of semaphores = %+v, %v", ls, err)
	}
	// Resize writes its record and the holders' limit with those grants.
	if err := c.Resize(ctx, "s", 1); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if st, err := c.Inspect(ctx, "s", sem); err != nil || st.Limit != 1 {
		t.Fatalf("Inspect of a resized semaphore = %+v, %v; want Limit 1", st, err)
	}
	if _, err := c.TryAcquire(ctx, "s", sem); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a semaphore resized to 1 with 1 held = %v, want ErrNotAcquired", err)
	}
	if err := c.Resize(ctx, "s", 0); err != nil {
		t.Fatalf("Resize to 0: %v", err)
	}
	if _, err := c.ForceRelease(ctx, "s", p.Fence(), sem); err != nil {
		t.Fatalf("ForceRelease of a permit: %v", err)
	}
	c.Close()

	// One grant less: ErrPermission at Open, at the first acquire or at the
	// first release, at once.
	for i, g := range grants {
		less := append(append([]string(nil), grants[:i]...), grants[i+1:]...)
		role, pw := secRole(t, admin, less...)
		what := strings.Fields(g)[1]
		start := time.Now()
		c, err := locker.Open(ctx, secURL(t, role, pw, paramSchema, schema, paramTable, table))
		if err == nil {
			var l *locker.Lock
			if l, err = c.Acquire(ctx, "a"); err == nil {
				err = l.Release(ctx) // DELETE
			}
			c.Close()
		}
		took := time.Since(start)
		if !errors.Is(err, locker.ErrPermission) {
			t.Errorf("without %s: %v, want ErrPermission", what, err)
			continue
		}
		if took > time.Second {
			t.Errorf("without %s: ErrPermission after %v, want at once", what, took)
		}
		t.Logf("without %s (%v): %v", what, took.Round(time.Millisecond), err)
	}
}

// drainWakes waits for the wake-up that a new listening connection gives
// every subscriber, and empties ch.
func drainWakes(d *Driver, ch <-chan struct{}) {
	d.lis.mu.Lock() // the connection's wake-all runs under it
	d.lis.mu.Unlock()
	select {
	case <-ch:
	default:
	}
}

// A role without grants on the table cannot take, refresh or free a lock;
// a role with them cannot either through the driver without the token.
func TestSecureOtherRole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := secAdmin(t)
	schema, table := secTable(t, admin)
	appRole, appPW := secRole(t, admin, leastGrants(schema, table)...)
	app, err := Open(ctx, secURL(t, appRole, appPW, paramSchema, schema, paramTable, table))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	key := backend.Key("other", "x")
	held := backend.Claim{Key: key, Token: "holder-" + randHex(8), Owner: "holder", TTL: time.Minute}
	g, err := app.TryAcquire(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	held.Fence = g.Fence

	// No grant on the table: refused at Open (the notification key is
	// read there).
	noneRole, nonePW := secRole(t, admin, "GRANT USAGE ON SCHEMA "+quote(schema)+" TO %s")
	if none, err := Open(ctx, secURL(t, noneRole, nonePW, paramSchema, schema, paramTable, table)); !errors.Is(err, backend.ErrPermission) {
		if err == nil {
			none.Close()
		}
		t.Errorf("Open without grants = %v, want ErrPermission", err)
	}
	// SELECT only, a monitor's role: it can look, not touch.
	roRole, roPW := secRole(t, admin, leastGrants(schema, table)[:2]...)
	ro, err := Open(ctx, secURL(t, roRole, roPW, paramSchema, schema, paramTable, table))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	peerRole, peerPW := secRole(t, admin, leastGrants(schema, table)...)
	peer, err := Open(ctx, secURL(t, peerRole, peerPW, paramSchema, schema, paramTable, table))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	guess := held
	guess.Token = "thief-" + randHex(8)
	for _, tc := range []struct {
		name string
		d    *Driver
		want error
	}{
		{"SELECT only", ro, backend.ErrPermission},
		{"table grants, no token", peer, nil},
	} {
		want := func(op string, err, otherwise error) {
			if tc.want != nil {
				otherwise = tc.want
			}
			if !errors.Is(err, otherwise) {
				t.Errorf("%s: %s = %v, want %v", tc.name, op, err, otherwise)
			}
		}
		_, err := tc.d.TryAcquire(ctx, guess)
		want("steal (TryAcquire)", err, backend.ErrNotAcquired)
		want("Refresh", tc.d.Refresh(ctx, guess), backend.ErrNotHeld)
		want("Release", tc.d.Release(ctx, guess), backend.ErrNotHeld)
	}
	info, err := app.Inspect(ctx, key, backend.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Owner != "holder" || info.Fence != held.Fence {
		t.Fatalf("the lock after the attempts: %+v, want held by holder at fence %d", info, held.Fence)
	}
	if err := app.Refresh(ctx, held); err != nil {
		t.Fatalf("the holder's refresh: %v", err)
	}
}

// A role that can write the table can rewrite or delete a held row: the
// holder's lost signal fires by its next refresh, at most TTL/3 (plus the
// refresh's round trip) after the theft, long before the TTL runs out.
func TestSecureTheftFiresLost(t *testing.T) {
	t.Parallel()
	admin := secAdmin(t)
	schema, table := secTable(t, admin)
	role, pw := secRole(t, admin, leastGrants(schema, table)...)
	qt := newStatements(schema, table).table
	// The thief: the same grants, plus DELETE for the last case.
	thiefRole, thiefPW := secRole(t, admin, append(leastGrants(schema, table), "GRANT DELETE ON "+qt+" TO %s")...)
	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
	thief, err := pgxpool.New(tctx, secURL(t, thiefRole, thiefPW))
	tcancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(thief.Close) // the subtests run after this function returns

	const ttl = 3 * time.Second
	// The watchdog refreshes every TTL/3 after the last refresh was sent
	// (up to TTL/12 early); a refresh that finds the row changed fires the
	// lost signal. The slack covers that refresh's round trip.
	const bound = ttl/3 + 500*time.Millisecond
	for _, tc := range []struct{ name, sql string }{
		{"new token", `UPDATE ` + qt + ` SET token = 'thief' WHERE name = $1`},
		{"new owner", `UPDATE ` + qt + ` SET owner = 'thief' WHERE name = $1`},
		{"new version", `UPDATE ` + qt + ` SET version = version + 1 WHERE name = $1`},
		{"expired", `UPDATE ` + qt + ` SET expires_at = clock_timestamp() WHERE name = $1`},
		{"deleted", `DELETE FROM ` + qt + ` WHERE name = $1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := locker.Open(ctx, secURL(t, role, pw, paramSchema, schema, paramTable, table), locker.WithNamespace("theft"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			name := strings.ReplaceAll(tc.name, " ", "-")
			l, err := c.Acquire(ctx, name, locker.TTL(ttl), locker.Owner("holder"))
			if err != nil {
				t.Fatal(err)
			}
			tag, err := thief.Exec(ctx, tc.sql, backend.Key("theft", name))
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("theft: %v, %d rows", err, tag.RowsAffected())
			}
			stolen := time.Now()
			select {
			case <-l.Lost():
			case <-time.After(ttl):
				t.Fatalf("no lost signal %v after the theft", ttl)
			}
			took := time.Since(stolen)
			if took > bound {
				t.Errorf("lost signal %v after the theft, want at most %v (TTL/3 and a round trip)", took, bound)
			}
			if !errors.Is(l.Err(), locker.ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", l.Err())
			}
			t.Logf("lost after %v: %v", took.Round(time.Millisecond), l.Err())
		})
	}
}

// A role with only CONNECT may LISTEN on the channel, but the releases it
// hears name no lock: the payload is a hash keyed with a secret of the
// table, not the name nor a plain hash of it.
func TestSecureNotificationsLeakNoName(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := secAdmin(t)
	schema, table := secTable(t, admin)
	appRole, appPW := secRole(t, admin, leastGrants(schema, table)...)
	app, err := Open(ctx, secURL(t, appRole, appPW, paramSchema, schema, paramTable, table))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()

	spyRole, spyPW := secRole(t, admin) // CONNECT, which PUBLIC has: nothing else
	spy, err := pgx.Connect(ctx, secURL(t, spyRole, spyPW))
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close(context.Background())
	if _, err := spy.Exec(ctx, app.sql.listen); err != nil {
		t.Fatalf("LISTEN as a role with CONNECT only: %v", err)
	}
	var n int
	if err := spy.QueryRow(ctx, "SELECT count(*) FROM "+app.TableName()).Scan(&n); !errors.Is(permission(err), backend.ErrPermission) {
		t.Fatalf("the spy reads the table (%v): the test proves nothing", err)
	}

	names := []string{"payroll", "customer-42", "deploy"}
	for _, name := range names {
		// Someone waits for the name: its release notifies (listen.go).
		_, unsubscribe, err := app.Subscribe(ctx, backend.Key("spied", name))
		if err != nil {
			t.Fatal(err)
		}
		defer unsubscribe()
		l := backend.Claim{Key: backend.Key("spied", name), Token: randHex(8), TTL: time.Minute}
		if _, err := app.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := app.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		key := backend.Key("spied", name)
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		msg, err := spy.WaitForNotification(wctx)
		wcancel()
		if err != nil {
			t.Fatalf("the spy heard %s's release? %v (releases must still notify)", key, err)
		}
		p := msg.Payload
		for _, leak := range plainForms(key, name) {
			if strings.Contains(p, leak) || len(p) >= 8 && strings.Contains(leak, p[:8]) {
				t.Errorf("payload %q gives away %q", p, key)
			}
		}
		if want := notifyPayload(app.notifySecret, key); p != want {
			t.Errorf("payload %q, want the keyed hash %q", p, want)
		}
	}
}

// plainForms are what a listener could match a guessed name against.
func plainForms(key, name string) []string {
	var out []string
	for _, s := range []string{key, name} {
		h := sha256.Sum256([]byte(s))
		m := md5.Sum([]byte(s))
		out = append(out, s, hex.EncodeToString(h[:]), hex.EncodeToString(m[:]))
	}
	return out
}

// No password, from the userinfo or from password= or sslpassword=, appears
// in an error or a log line, whatever fails.
func TestSecureNoSecretInMessages(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const (
		userCanary = "CanaryUser7Q9"
		qCanary    = "CanaryQuery8W2"
		sslCanary  = "CanarySsl3K5"
	)
	other := testenv.NewCerts(t)
	certs := testenv.Secure(t)
	addr := testenv.PostgresTLSAddr()
	base := func(user *url.Userinfo, kv ...string) string {
		u := &url.URL{Scheme: "postgres", Host: addr, Path: "/locker", User: user}
		q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.CA}}
		for i := 0; i+1 < len(kv); i += 2 {
			q.Set(kv[i], kv[i+1])
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	withCanary := url.UserPassword("admin", userCanary)
	cases := map[string]string{
		"wrong userinfo password": base(withCanary),
		"wrong password=":         base(url.User("admin"), "password", qCanary),
		"sslpassword=, wrong CA":  base(withCanary, "password", qCanary, "sslpassword", sslCanary, "sslrootcert", other.CA),
		"sslpassword=, client key of another CA": base(url.User("admin"), "password", qCanary, "sslpassword", sslCanary,
			"sslcert", other.ClientCert, "sslkey", other.ClientKey),
		"plain TCP refused":        base(withCanary, "password", qCanary, "sslmode", "disable"),
		"unknown parameter":        base(withCanary, "password", qCanary, "sslpassword", sslCanary, "bogus", "1"),
		"bad connect_timeout":      base(withCanary, "password", qCanary, "connect_timeout", "soon"),
		"missing sslkey":           base(withCanary, "sslpassword", sslCanary, "sslcert", certs.ClientCert, "sslkey", "/nonexistent/key.pem"),
		"nothing listens":          strings.Replace(base(withCanary, "password", qCanary, "connect_timeout", "1"), addr, "127.0.0.1:1", 1),
		"percent-encoded password": base(url.UserPassword("admin", userCanary+"/?#%")),
	}
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	for name, raw := range cases {
		msgs := []string{}
		if _, err := Open(ctx, raw); err != nil {
			msgs = append(msgs, err.Error())
		} else {
			t.Errorf("%s: sqllock.Open succeeded", name)
		}
		if c, err := locker.Open(ctx, raw, locker.WithLogger(logger)); err != nil {
			msgs = append(msgs, err.Error())
		} else {
			c.Close()
			t.Errorf("%s: locker.Open succeeded", name)
		}
		for _, m := range msgs {
			for _, canary := range []string{userCanary, qCanary, sslCanary} {
				if strings.Contains(m, canary) {
					t.Errorf("%s: the message has the secret %s: %s", name, canary, m)
				}
			}
		}
		t.Logf("%s: %s", name, msgs[len(msgs)-1])
	}
	mu.Lock()
	defer mu.Unlock()
	for _, canary := range []string{userCanary, qCanary, sslCanary} {
		if strings.Contains(logs.String(), canary) {
			t.Errorf("a log line has the secret %s: %s", canary, logs.String())
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A table without a notification key (made by an older version, or by
// schema.sql) gets one from the first driver, even with least privilege;
// a key released by someone is made again; every driver reads the same.
func TestSecureNotifyKeyMadeOnFirstUse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := secAdmin(t)
	schema, table := secTable(t, admin)
	qt := newStatements(schema, table).table
	for _, tc := range []struct{ name, sql string }{
		{"no row", `DELETE FROM ` + qt + ` WHERE name = $1`},
		{"released", `UPDATE ` + qt + ` SET token = NULL WHERE name = $1`},
	} {
		if _, err := admin.Exec(ctx, tc.sql, notifyKeyName); err != nil {
			t.Fatal(err)
		}
		role, pw := secRole(t, admin, leastGrants(schema, table)...)
		raw := secURL(t, role, pw, paramSchema, schema, paramTable, table, paramCreate, "false")
		a, err := Open(ctx, raw)
		if err != nil {
			t.Fatalf("%s: Open: %v", tc.name, err)
		}
		b, err := Open(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		var stored string
		if err := admin.QueryRow(ctx, `SELECT token FROM `+qt+` WHERE name = $1 AND expires_at = 'infinity'`, notifyKeyName).Scan(&stored); err != nil {
			t.Fatalf("%s: the key row: %v", tc.name, err)
		}
		if len(stored) != 64 || a.notifySecret != stored || b.notifySecret != stored {
			t.Errorf("%s: key %q, drivers read %q and %q", tc.name, stored, a.notifySecret, b.notifySecret)
		}
		a.Close()
		b.Close()
	}
}
