package etcdlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// These tests run against the secured etcd (services.sh instance etcd-tls):
// TLS only, client certificates required, auth on. The ones that hold a
// time bound do not run in parallel with the others: every password
// authentication costs the server a bcrypt hash, and the package's parallel
// tests together would measure the CPU, not the driver.

// secure is the secured etcd, its certificates and a root client.
type secure struct {
	ep    string
	certs *testenv.SecureCerts
	admin *clientv3.Client
}

func newSecure(t *testing.T) *secure {
	t.Helper()
	ep := testenv.EtcdTLSEndpoint()
	testenv.Require(t, ep)
	certs := testenv.Secure(t)
	tc := tlsConfig(t, certs.CA, certs.AdminCert, certs.AdminKey)
	// The admin certificate's CN is root: etcd's identity for it.
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd-tls admin client: %v", err)
	}
	t.Cleanup(func() { admin.Close() })
	return &secure{ep: ep, certs: certs, admin: admin}
}

func tlsConfig(t *testing.T, ca, cert, key string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}
}

var randHex = testutil.RandHex

// prefix is a lock prefix unique to the test, deleted at its end.
func (s *secure) prefix(t *testing.T) string {
	p := "/locker-sec/" + randHex(4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.admin.Delete(ctx, p+"/", clientv3.WithPrefix())
	})
	return p
}

// perm is one permission of a role: a key, or a prefix range when prefix.
type perm struct {
	typ    clientv3.PermissionType
	key    string
	prefix bool
}

// user makes a user with a fresh password and a role holding perms (no
// role when perms is empty), removed at the end of the test.
func (s *secure) user(t *testing.T, perms ...perm) (name, password string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	name, password = "lt-"+randHex(4), "pw-"+randHex(8)
	if _, err := s.admin.UserAdd(ctx, name, password); err != nil {
		t.Fatalf("user add: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.admin.UserDelete(ctx, name)
		s.admin.RoleDelete(ctx, name)
	})
	if len(perms) == 0 {
		return name, password
	}
	if _, err := s.admin.RoleAdd(ctx, name); err != nil {
		t.Fatalf("role add: %v", err)
	}
	for _, p := range perms {
		end := ""
		if p.prefix {
			end = clientv3.GetPrefixRangeEnd(p.key)
		}
		if _, err := s.admin.RoleGrantPermission(ctx, name, p.key, end, p.typ); err != nil {
			t.Fatalf("grant: %v", err)
		}
	}
	if _, err := s.admin.UserGrantRole(ctx, name, name); err != nil {
		t.Fatalf("grant role: %v", err)
	}
	return name, password
}

// url is an etcd URL of the secured server with the client certificate,
// as user:password when user is not empty. kv replace query parameters.
func (s *secure) url(user, password, prefix string, kv ...string) string {
	v := url.Values{"ca": {s.certs.CA}, "cert": {s.certs.ClientCert}, "key": {s.certs.ClientKey}, "dial_timeout": {"2s"}}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			v.Del(kv[i])
		} else {
			v.Set(kv[i], kv[i+1])
		}
	}
	ui := ""
	if user != "" {
		ui = url.UserPassword(user, password).String() + "@"
	}
	return "etcd://" + ui + s.ep + prefix + "?" + v.Encode()
}

// exercise takes a lock, refreshes it, has a second client wait for it,
// releases it and checks that the waiter gets it; then the same with a
// semaphore whose limit is raised (its resize key is under the prefix
// too).
func exercise(t *testing.T, raw string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := locker.Open(ctx, raw)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer a.Close()
	b, err := locker.Open(ctx, raw)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer b.Close()
	defer a.Resize(ctx, "sem", 0)
	for _, c := range []struct {
		name string
		opts []locker.LockOption
		free func(*locker.Lock) error
	}{
		{"job", nil, func(l *locker.Lock) error { return l.Release(ctx) }},
		{"sem", []locker.LockOption{locker.Semaphore(1)}, func(*locker.Lock) error { return a.Resize(ctx, "sem", 2) }},
	} {
		opts := append(c.opts, locker.TTL(3*time.Second))
		l, err := a.Acquire(ctx, c.name, opts...)
		if err != nil {
			t.Fatalf("Acquire %s: %v", c.name, err)
		}
		defer l.Release(ctx)
		if err := l.Refresh(ctx); err != nil {
			t.Fatalf("Refresh %s: %v", c.name, err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := b.Acquire(ctx, c.name, opts...)
			if err == nil {
				err = w.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(200 * time.Millisecond) // let the waiter queue
		if err := c.free(l); err != nil {
			t.Fatalf("Release or Resize %s: %v", c.name, err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("waiter of %s: %v", c.name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the waiter did not get %s within 5s of its release or resize", c.name)
		}
	}
}

// TLS from the URL (ca, cert, key) with a password, and with the client
// certificate alone as the identity (its CN, "locker").
func TestSecureTLSFromURL(t *testing.T) {
	s := newSecure(t)
	t.Run("password", func(t *testing.T) {
		prefix := s.prefix(t)
		user, pw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
		exercise(t, s.url(user, pw, prefix))
	})
	t.Run("certificate", func(t *testing.T) {
		// User "locker" is the client certificate's CN; first with no
		// role, then with the grant.
		prefix := s.prefix(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.admin.UserDelete(ctx, "locker")
		s.admin.RoleDelete(ctx, "locker-cert")
		if _, err := s.admin.UserAddWithOptions(ctx, "locker", "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s.admin.UserDelete(ctx, "locker")
			s.admin.RoleDelete(ctx, "locker-cert")
		})
		start := time.Now()
		d, err := Open(ctx, s.url("", "", prefix))
		took := time.Since(start)
		if err == nil {
			d.Close()
			t.Fatal("Open with a certificate whose CN has no role succeeded")
		}
		if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), `"locker"`) || took > time.Second {
			t.Fatalf("Open without a role: %v after %v; want ErrPermission naming user \"locker\" within 1s", err, took)
		}
		t.Logf("no role: %v (%v)", err, took.Round(time.Millisecond))
		if _, err := s.admin.RoleAdd(ctx, "locker-cert"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.admin.RoleGrantPermission(ctx, "locker-cert", prefix+"/", clientv3.GetPrefixRangeEnd(prefix+"/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.admin.UserGrantRole(ctx, "locker", "locker-cert"); err != nil {
			t.Fatal(err)
		}
		exercise(t, s.url("", "", prefix))
	})
}

// TLS failures name their cause: a server certificate from another CA, a
// client certificate from another CA, no client certificate, plaintext to
// the TLS port. Each fails within dial_timeout and the probe's bound.
func TestSecureTLSFailures(t *testing.T) {
	s := newSecure(t)
	t.Parallel()
	prefix := s.prefix(t)
	user, pw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
	other := testenv.NewCerts(t)
	const dial = time.Second
	bound := dial + probeTimeout + 500*time.Millisecond
	for _, c := range []struct {
		name string
		kv   []string
		want string
	}{
		{"server CA unknown", []string{"ca", other.CA}, "x509: certificate signed by unknown authority"},
		{"client certificate from another CA", []string{"cert", other.ClientCert, "key", other.ClientKey}, "tls: "},
		{"no client certificate", []string{"cert", "", "key", ""}, "client certificate"},
		{"plaintext", []string{"ca", "", "cert", "", "key", ""}, "requires TLS"},
	} {
		for _, as := range []string{"", user} {
			p := ""
			if as != "" {
				p = pw
			}
			raw := s.url(as, p, prefix, append(c.kv, "dial_timeout", dial.String())...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			d, err := Open(ctx, raw)
			took := time.Since(start)
			cancel()
			if err == nil {
				d.Close()
				t.Errorf("%s (user %q): Open succeeded", c.name, as)
				continue
			}
			if !strings.Contains(err.Error(), c.want) || took > bound || errors.Is(err, backend.ErrPermission) {
				t.Errorf("%s (user %q): %v after %v; want %q within %v", c.name, as, err, took, c.want, bound)
			}
			if as != "" && strings.Contains(err.Error(), pw) {
				t.Errorf("%s: the password is in the error: %v", c.name, err)
			}
			t.Logf("%s (user %q): %v (%v)", c.name, as, err, took.Round(time.Millisecond))
		}
	}
}

// A wrong password, an unknown user and a user without a role are refused
// at Open with ErrPermission, within a second.
func TestSecureCredentials(t *testing.T) {
	s := newSecure(t)
	prefix := s.prefix(t)
	user, pw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
	norole, norolePW := s.user(t)
	for _, c := range []struct {
		name, user, pw, want string
	}{
		{"wrong password", user, pw + "x", "authentication failed"},
		{"unknown user", "nobody-" + randHex(4), pw, "authentication failed"},
		{"user without a role", norole, norolePW, "may not read"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		d, err := Open(ctx, s.url(c.user, c.pw, prefix))
		took := time.Since(start)
		cancel()
		if err == nil {
			d.Close()
			t.Errorf("%s: Open succeeded", c.name)
			continue
		}
		if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), c.want) || took > time.Second {
			t.Errorf("%s: %v after %v; want ErrPermission saying %q within 1s", c.name, err, took, c.want)
		}
		t.Logf("%s: %v (%v)", c.name, err, took.Round(time.Millisecond))
	}
}

// Least privilege: readwrite on the prefix range, written with or without
// the trailing slash, is enough; read only, or readwrite on another prefix,
// is refused at Open with ErrPermission saying which permission is missing,
// and at once (not retried) by a driver built without Open's check.
func TestSecureLeastPrivilege(t *testing.T) {
	s := newSecure(t)
	t.Run("readwrite prefix/", func(t *testing.T) {
		prefix := s.prefix(t)
		user, pw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
		exercise(t, s.url(user, pw, prefix))
	})
	t.Run("readwrite prefix", func(t *testing.T) {
		prefix := s.prefix(t)
		user, pw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix, true})
		exercise(t, s.url(user, pw, prefix))
	})
	prefix := s.prefix(t)
	for _, c := range []struct {
		name string
		perm perm
		want string
	}{
		{"read only", perm{clientv3.PermissionType(clientv3.PermRead), prefix + "/", true}, "may not write"},
		{"write only", perm{clientv3.PermissionType(clientv3.PermWrite), prefix + "/", true}, "may not read"},
		{"another prefix", perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "-other/", true}, "may not read"},
		{"the prefix key alone", perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", false}, "may not read"},
	} {
		user, pw := s.user(t, c.perm)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		d, err := Open(ctx, s.url(user, pw, prefix))
		took := time.Since(start)
		if err == nil {
			d.Close()
			t.Errorf("%s: Open succeeded", c.name)
		} else if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), c.want) || took > time.Second {
			t.Errorf("%s: %v after %v; want ErrPermission saying %q within 1s", c.name, err, took, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}

		// Without Open's check, the first acquisition fails at once.
		cfg, _, err := ClientConfig(s.url(user, pw, prefix))
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := locker.New(mustNew(t, cli, WithPrefix(prefix)))
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		l, err := c2.Acquire(ctx, "job", locker.TTL(3*time.Second))
		took = time.Since(start)
		if err == nil {
			l.Release(ctx)
			t.Errorf("%s: Acquire succeeded", c.name)
		} else if !errors.Is(err, locker.ErrPermission) || took > time.Second {
			t.Errorf("%s: Acquire: %v after %v; want ErrPermission within 1s", c.name, err, took)
		}
		c2.Close()
		cli.Close()
		cancel()
	}
}

// A principal without rights on the prefix can neither release (delete the
// holder's entry), revoke its lease, nor queue; the holder keeps the lock.
func TestSecureOtherPrincipal(t *testing.T) {
	s := newSecure(t)
	t.Parallel()
	prefix := s.prefix(t)
	holder, hpw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
	other, opw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "-other/", true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := locker.Open(ctx, s.url(holder, hpw, prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "job", locker.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	key, lease := entryOf(ctx, t, s.admin, prefix)

	cfg, _, err := ClientConfig(s.url(other, opw, prefix))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Delete(ctx, key); !errors.Is(permission(err), backend.ErrPermission) {
		t.Errorf("delete the holder's entry: %v; want permission denied", err)
	}
	if _, err := cli.Revoke(ctx, lease); !errors.Is(permission(err), backend.ErrPermission) {
		t.Errorf("revoke the holder's lease: %v; want permission denied", err)
	}
	if _, err := cli.Put(ctx, key, "thief"); !errors.Is(permission(err), backend.ErrPermission) {
		t.Errorf("overwrite the holder's entry: %v; want permission denied", err)
	}
	thief, err := locker.New(mustNew(t, cli, WithPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	defer thief.Close()
	if _, err := thief.TryAcquire(ctx, "job"); !errors.Is(err, locker.ErrPermission) {
		t.Errorf("TryAcquire: %v; want ErrPermission", err)
	}
	if err := l.Refresh(ctx); err != nil {
		t.Errorf("the holder's Refresh: %v", err)
	}
	select {
	case <-l.Lost():
		t.Errorf("the holder lost the lock: %v", l.Err())
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// entryOf returns the only entry under prefix and its lease.
func entryOf(ctx context.Context, t *testing.T, admin *clientv3.Client, prefix string) (string, clientv3.LeaseID) {
	t.Helper()
	resp, err := admin.Get(ctx, prefix+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the entries under %s: %v, %v", prefix, resp, err)
	}
	return string(resp.Kvs[0].Key), clientv3.LeaseID(resp.Kvs[0].Lease)
}

// theftBound is how soon a holder learns that its entry was deleted or
// overwritten, or its lease revoked: the driver checks its entries (and its
// lease, by the keep-alive) every TTL/3, so TTL/3 plus two round trips (a
// keep-alive and a read); the rest of the allowance is for a loaded machine.
func theftBound(ttl time.Duration) time.Duration { return ttl/3 + 500*time.Millisecond }

// Theft by a principal with write on the prefix: it deletes the holder's
// entry, overwrites it, or revokes the holder's lease (the lease ID is in
// the entry's name), right after the acquisition or right after one of the
// driver's checks (the worst case). The holder's Lost fires within
// theftBound.
func TestSecureTheft(t *testing.T) {
	s := newSecure(t)
	const ttl = 3 * time.Second // a check every second
	for _, how := range []string{"delete", "overwrite", "revoke"} {
		for _, phase := range []string{"at once", "after a check"} {
			t.Run(how+" "+phase, func(t *testing.T) {
				prefix := s.prefix(t)
				holder, hpw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
				thiefUser, tpw := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				thief, err := locker.Open(ctx, s.url(thiefUser, tpw, prefix))
				if err != nil {
					t.Fatal(err)
				}
				defer thief.Close()
				cli := thief.Driver().(*Driver).Client()
				c, err := locker.Open(ctx, s.url(holder, hpw, prefix))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				// A fresh driver grants its lease here, and checks every TTL/3
				// from then on.
				l, err := c.Acquire(ctx, "job", locker.TTL(ttl))
				if err != nil {
					t.Fatal(err)
				}
				key, lease := entryOf(ctx, t, s.admin, prefix)
				if phase == "after a check" {
					time.Sleep(ttl/3 + 100*time.Millisecond)
				}
				start := time.Now()
				switch how {
				case "delete":
					_, err = cli.Delete(ctx, key)
				case "overwrite":
					_, err = cli.Put(ctx, key, "thief")
				case "revoke":
					_, err = cli.Revoke(ctx, lease)
				}
				if err != nil {
					t.Fatalf("%s: %v", how, err)
				}
				bound := theftBound(l.TTL())
				select {
				case <-l.Lost():
					took := time.Since(start)
					t.Logf("lost after %v (bound %v): %v", took.Round(time.Millisecond), bound, l.Err())
					if took > bound {
						t.Errorf("the holder learnt of the theft after %v; want within %v", took, bound)
					}
				case <-time.After(bound + 5*time.Second):
					t.Fatalf("the holder was not told within %v", bound+5*time.Second)
				}
				if !errors.Is(l.Err(), locker.ErrLost) {
					t.Errorf("Err: %v; want ErrLost", l.Err())
				}
				if how == "overwrite" {
					// The overwritten entry, no longer on the holder's lease,
					// would block the lock for good: the holder's driver
					// deletes it by its next check.
					deadline := time.Now().Add(bound)
					for {
						resp, err := s.admin.Get(ctx, key, clientv3.WithCountOnly())
						if err == nil && resp.Count == 0 {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("the overwritten entry is still there %v after the loss (%v)", bound, err)
						}
						time.Sleep(50 * time.Millisecond)
					}
				}
				// The thief can take the lock now; the holder was told.
				tl, err := thief.TryAcquire(ctx, "job")
				if err != nil {
					t.Fatalf("the thief's TryAcquire: %v", err)
				}
				tl.Release(ctx)
			})
		}
	}
}

// No secret reaches an error: canary passwords in the userinfo, in the
// query and in ETCD_PASSWORD, through etcdlock.Open and locker.Open, for a
// malformed URL, a wrong password and a TLS failure.
func TestSecureNoSecretInErrors(t *testing.T) {
	s := newSecure(t)
	prefix := s.prefix(t)
	user, _ := s.user(t, perm{clientv3.PermissionType(clientv3.PermReadWrite), prefix + "/", true})
	canary := "canary-" + randHex(6)
	other := testenv.NewCerts(t)
	var urls []string
	for i, kv := range [][]string{
		{"password", canary + "-q0"},
		{"token", canary + "-q1"},
		{"secret", canary + "-q2"},
		{"ca", other.CA},
		{},
	} {
		urls = append(urls, s.url(user, canary+"-u"+strconv.Itoa(i), prefix, kv...))
	}
	t.Setenv(PasswordEnv, canary+"-env")
	urls = append(urls, "etcd://"+user+"@"+s.ep+prefix+"?"+url.Values{"ca": {s.certs.CA}, "cert": {s.certs.ClientCert}, "key": {s.certs.ClientKey}, "dial_timeout": {"1s"}}.Encode())
	for _, raw := range urls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := Open(ctx, raw)
		if err == nil {
			d.Close()
			t.Errorf("Open succeeded")
		} else if strings.Contains(err.Error(), canary) {
			t.Errorf("etcdlock.Open: a secret is in the error: %v", err)
		}
		c, err := locker.Open(ctx, raw)
		if err == nil {
			c.Close()
			t.Errorf("locker.Open succeeded")
		} else if strings.Contains(err.Error(), canary) {
			t.Errorf("locker.Open: a secret is in the error: %v", err)
		} else {
			t.Logf("%v", err)
		}
		cancel()
	}
}
