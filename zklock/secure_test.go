package zklock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// Tests against the secured ZooKeeper (instance zk-tls): a TLS client port
// only, client certificates required, and a super user, admin, whose
// digest password is testenv.AdminPassword.

// secTLS is a client TLS configuration for zk-tls with the given client
// certificate.
func secTLS(t *testing.T, cert, key string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(testenv.Secure(t).CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no CA certificate")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// secConn connects to zk-tls with the client certificate and, unless
// empty, the digest credential auth ("user:password").
func secConn(t *testing.T, auth string) *zk.Conn {
	t.Helper()
	addr := testenv.ZKTLSAddr()
	sc := testenv.Secure(t)
	tc := secTLS(t, sc.ClientCert, sc.ClientKey)
	conn, _, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogInfo(false),
		zk.WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
			return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, network, addr, tc)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitSession(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		if err := conn.AddAuth("digest", []byte(auth)); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// secAdmin is a connection of the super user, and a fresh base node for the
// test, under which anyone may create a root, deleted at the end.
func secAdmin(t *testing.T) (*zk.Conn, string) {
	t.Helper()
	testenv.Require(t, testenv.ZKTLSAddr())
	admin := secConn(t, "admin:"+testenv.AdminPassword())
	base := "/locker-sec-" + newToken(t)[:8]
	if _, err := admin.Create(base, nil, 0, zk.WorldACL(zk.PermCreate|zk.PermRead)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTree(admin, base) })
	return admin, base
}

// secURL is a zk URL for zk-tls with the root, the userinfo ("" or
// "user:password@") and the TLS parameters of the client certificate,
// changed or added to by kv.
func secURL(t *testing.T, userinfo, root string, kv ...string) *url.URL {
	t.Helper()
	sc := testenv.Secure(t)
	v := url.Values{"ca": {sc.CA}, "cert": {sc.ClientCert}, "key": {sc.ClientKey}, "connect_timeout": {"5s"}, "session_timeout": {"4s"}}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "" {
			v.Del(kv[i])
		} else {
			v.Set(kv[i], kv[i+1])
		}
	}
	u, err := url.Parse("zk://" + userinfo + testenv.ZKTLSAddr() + root + "?" + v.Encode())
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func secOpen(t *testing.T, u *url.URL) (*Driver, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	d, err := Open(ctx, u.String())
	took := time.Since(start)
	if err != nil {
		return nil, took, err
	}
	t.Cleanup(func() { d.Close() })
	return d, took, nil
}

// TLS from the URL, digest auth from its userinfo: the driver locks on the
// secured server.
func TestSecureTLSFromURL(t *testing.T) {
	_, base := secAdmin(t)
	t.Parallel()
	for _, extra := range [][]string{nil, {"tls", "true"}, {"server_name", "localhost"}} {
		d, _, err := secOpen(t, secURL(t, "locker:Canary-pw-1@", base+"/url", extra...))
		if err != nil {
			t.Fatalf("%v: %v", extra, err)
		}
		ctx := context.Background()
		l := lockFor(t, uniqueKey(t))
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatalf("%v: TryAcquire: %v", extra, err)
		}
		if err := d.Refresh(ctx, l); err != nil {
			t.Fatalf("%v: Refresh: %v", extra, err)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatalf("%v: Release: %v", extra, err)
		}
	}
}

// A client certificate from another CA, or none, is refused at once with
// the TLS cause and ErrPermission; a server certificate we cannot verify
// fails at once with its cause; plaintext against the TLS port says that
// it may be one.
func TestSecureTLSRefused(t *testing.T) {
	_, base := secAdmin(t)
	t.Parallel()
	other := testenv.NewCerts(t)
	for _, c := range []struct {
		name  string
		kv    []string
		perm  bool
		want  string
		limit time.Duration
	}{
		{"client certificate of another CA", []string{"cert", other.ClientCert, "key", other.ClientKey}, true, "refused our client certificate", time.Second},
		{"no client certificate", []string{"cert", "", "key", ""}, true, "refused our client certificate", time.Second},
		{"server certificate of an unknown CA", []string{"ca", other.CA}, false, "unknown authority", time.Second},
		{"wrong server name", []string{"server_name", "elsewhere.example"}, false, "elsewhere.example", time.Second},
		{"plaintext", []string{"ca", "", "cert", "", "key", "", "connect_timeout", "1s"}, false, "a TLS port?", 2 * time.Second},
	} {
		_, took, err := secOpen(t, secURL(t, "locker:Canary-pw-2@", base+"/refused", c.kv...))
		switch {
		case err == nil:
			t.Errorf("%s: Open succeeded", c.name)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v, want an error that says %q", c.name, err, c.want)
		case errors.Is(err, backend.ErrPermission) != c.perm:
			t.Errorf("%s: %v: ErrPermission is %v, want %v", c.name, err, !c.perm, c.perm)
		case strings.Count(err.Error(), c.want) != 1:
			t.Errorf("%s: %v: says %q more than once", c.name, err, c.want)
		case took > c.limit:
			t.Errorf("%s: Open took %v, want at most %v", c.name, took, c.limit)
		case strings.Contains(err.Error(), "Canary"):
			t.Errorf("%s: %v: shows the password", c.name, err)
		default:
			t.Logf("%s: %v after %v", c.name, err, took.Round(time.Millisecond))
		}
	}
}

// A wrong digest password fails Open with ErrPermission, within a second,
// whether or not the wrong identity may read the root's ACL's hashes.
func TestSecureWrongPassword(t *testing.T) {
	admin, base := secAdmin(t)
	t.Parallel()
	const pw, wrong = "Canary-pw-3", "Canary-wrong-4"
	// A root the driver made, with the default ACL; and one made by the
	// administrator with the least-privilege ACL.
	made := base + "/made"
	if _, _, err := secOpen(t, secURL(t, "locker:"+pw+"@", made)); err != nil {
		t.Fatal(err)
	}
	least := base + "/least"
	if _, err := admin.Create(least, nil, 0, zk.DigestACL(leastPerms, "locker", pw)); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{made, least} {
		_, took, err := secOpen(t, secURL(t, "locker:"+wrong+"@", root))
		switch {
		case !errors.Is(err, locker.ErrPermission) || !strings.Contains(err.Error(), "wrong password"):
			t.Errorf("%s: Open with a wrong password = %v, want ErrPermission saying wrong password", root, err)
		case took > time.Second:
			t.Errorf("%s: Open took %v, want at most 1s", root, took)
		case strings.Contains(err.Error(), "Canary"):
			t.Errorf("%s: %v: shows a password", root, err)
		default:
			t.Logf("%s: %v after %v", root, err, took.Round(time.Millisecond))
		}
	}
}

// leastPerms is the documented grant: ADMIN is not needed.
const leastPerms = zk.PermCreate | zk.PermDelete | zk.PermRead | zk.PermWrite

// The documented least privilege, an ACL giving the credential CREATE,
// DELETE, READ and WRITE, is enough to acquire, refresh, release and wait;
// each permission less fails Open with ErrPermission naming it.
func TestSecureLeastPrivilege(t *testing.T) {
	admin, base := secAdmin(t)
	t.Parallel()
	const user, pw = "locker", "Canary-pw-5"
	sc := testenv.Secure(t)
	open := func(root string, perms int32) (*Driver, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := Dial(ctx, []string{testenv.ZKTLSAddr()}, WithTLS(secTLS(t, sc.ClientCert, sc.ClientKey)), WithRoot(root),
			WithDigestAuth(user, pw), WithACL(zk.DigestACL(perms, user, pw)), WithSessionTimeout(4*time.Second))
		if err == nil {
			t.Cleanup(func() { d.Close() })
		}
		return d, err
	}
	root := base + "/least"
	if _, err := admin.Create(root, nil, 0, zk.DigestACL(leastPerms, user, pw)); err != nil {
		t.Fatal(err)
	}
	holder, err := open(root, leastPerms)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := open(root, leastPerms)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	l := lockFor(t, key)
	if _, err := holder.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := holder.Refresh(ctx, l); err != nil {
		t.Fatal(err)
	}
	w := lockFor(t, key)
	got := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, waiter, w)
		got <- err
	}()
	if n, err := queueLen(admin, holder, key, 2); err != nil || n != 2 {
		t.Fatalf("the waiter did not queue: %d nodes, %v", n, err)
	}
	if err := holder.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if err := waiter.Release(ctx, w); err != nil {
		t.Fatal(err)
	}
	// CREATE taken away after Open: a blocking Acquire of a new name
	// fails at once with ErrPermission rather than retrying.
	if _, err := admin.SetACL(root, zk.DigestACL(leastPerms&^zk.PermCreate, user, pw), -1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = acquire(ctx, holder, lockFor(t, uniqueKey(t)))
	if !errors.Is(err, backend.ErrPermission) || time.Since(start) > time.Second {
		t.Fatalf("Acquire without CREATE on the root = %v after %v, want ErrPermission at once", err, time.Since(start))
	}
	t.Logf("Acquire without CREATE: %v after %v", err, time.Since(start).Round(time.Millisecond))

	for _, c := range []struct {
		perm int32
		name string
	}{{zk.PermCreate, "CREATE"}, {zk.PermDelete, "DELETE"}, {zk.PermRead, "READ"}, {zk.PermWrite, "WRITE"}} {
		p := leastPerms &^ c.perm
		r := base + "/without-" + strings.ToLower(c.name)
		if _, err := admin.Create(r, nil, 0, zk.DigestACL(p, user, pw)); err != nil {
			t.Fatal(err)
		}
		_, err := open(r, p)
		if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), c.name) || strings.Contains(err.Error(), pw) {
			t.Errorf("without %s: Open = %v, want ErrPermission naming %s", c.name, err, c.name)
		} else {
			t.Logf("without %s: %v", c.name, err)
		}
	}
}

// queueLen waits, up to 5 s, until key's queue has want nodes, and returns
// how many it has.
func queueLen(conn *zk.Conn, d *Driver, key string, want int) (int, error) {
	parent := d.parentPath(key)
	deadline := time.Now().Add(5 * time.Second)
	for {
		kids, _, err := conn.Children(parent)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return 0, err
		}
		if len(kids) == want || time.Now().After(deadline) {
			return len(kids), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Under the driver's ACL, a client without the credential (with a valid
// certificate) or another digest user can neither delete the holder's
// node nor queue; someone with the right (the super user) can delete it,
// and the holder is told within theftBound.
func TestSecureTheft(t *testing.T) {
	admin, base := secAdmin(t)
	t.Parallel()
	d, _, err := secOpen(t, secURL(t, "locker:Canary-pw-6@", base+"/theft"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	lost := make(chan error, 1)
	l := lockFor(t, key)
	l.OnLost = func(err error) { lost <- err }
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	_, path, err := holderSession(admin, d, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"", "other:Canary-pw-7"} {
		c := secConn(t, who)
		if err := c.Delete(path, -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%q: delete the holder's node = %v, want ErrNoAuth", who, err)
		}
		if _, err := c.Set(path, []byte("mine"), -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%q: overwrite the holder's node = %v, want ErrNoAuth", who, err)
		}
		if _, err := c.Create(d.parentPath(key)+"/"+nodePrefix+"squat", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%q: queue under the name = %v, want ErrNoAuth", who, err)
		}
		if err := c.Delete(d.parentPath(key), -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%q: delete the name's node = %v, want ErrNoAuth", who, err)
		}
	}
	if err := d.Refresh(ctx, l); err != nil {
		t.Fatalf("the holder after the attempts: %v", err)
	}
	select {
	case err := <-lost:
		t.Fatalf("lost signal without a theft: %v", err)
	default:
	}
	// Whether the driver's watch on its node is armed yet or not, it
	// tells: a node found missing when the watch is set is reported too.
	start := time.Now()
	if err := admin.Delete(path, -1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		took := time.Since(start)
		if !errors.Is(err, locker.ErrLost) {
			t.Fatalf("lost signal %v, want ErrLost", err)
		}
		t.Logf("told %v after the super user deleted the node: %v", took.Round(time.Microsecond), err)
	case <-time.After(theftBound):
		t.Fatalf("no lost signal within %v of the deletion", theftBound)
	}
}

// theftBound bounds, in tests on loopback, how soon a holder whose node
// someone deletes is told: the server's notification, a round trip (the
// bound of theft_test.go).
const theftBound = time.Second

// A root made by someone else with a world-writable ACL (zkCli's default)
// is refused at Open with the fix; nothing is created under it.
func TestSecureForeignRoot(t *testing.T) {
	admin, base := secAdmin(t)
	t.Parallel()
	root := base + "/world"
	if _, err := admin.Create(root, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	_, took, err := secOpen(t, secURL(t, "locker:Canary-pw-8@", root))
	if !errors.Is(err, locker.ErrPermission) || !strings.Contains(err.Error(), "world:anyone:cdrwa") || !strings.Contains(err.Error(), "setAcl "+root) || strings.Contains(err.Error(), "Canary") {
		t.Fatalf("Open under a world-writable root = %v, want ErrPermission naming the ACL and the fix", err)
	}
	if took > time.Second {
		t.Errorf("Open took %v", took)
	}
	if kids, _, err := admin.Children(root); err != nil || len(kids) != 0 {
		t.Fatalf("the refused Open left nodes: %v, %v", kids, err)
	}
}

// No password, from the userinfo or the query, appears in an error.
func TestSecureNoSecretInErrors(t *testing.T) {
	_, base := secAdmin(t)
	t.Parallel()
	const canaryUser, canaryQuery = "Canary-user-9", "Canary-query-10"
	other := testenv.NewCerts(t)
	sc := testenv.Secure(t)
	if _, _, err := secOpen(t, secURL(t, "locker:right-pw@", base+"/secret")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		userinfo string
		kv       []string
	}{
		{"wrong password", "locker:" + canaryUser + "@", nil},
		{"refused certificate", "locker:" + canaryUser + "@", []string{"cert", other.ClientCert, "key", other.ClientKey}},
		{"unknown parameter", "locker:" + canaryUser + "@", []string{"password", canaryQuery}},
		{"secret parameter", "locker:" + canaryUser + "@", []string{"auth_token", canaryQuery}},
		{"bad key file", "locker:" + canaryUser + "@", []string{"key", sc.CA}},
	} {
		_, _, err := secOpen(t, secURL(t, c.userinfo, base+"/secret", c.kv...))
		switch {
		case err == nil:
			t.Errorf("%s: Open succeeded", c.name)
		case strings.Contains(err.Error(), "Canary"):
			t.Errorf("%s: %v: shows a secret", c.name, err)
		default:
			t.Logf("%s: %v", c.name, err)
		}
	}
}
