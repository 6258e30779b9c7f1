package redislock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// The tests in this file run against the secured instance "redis-tls"
// (scripts/services.sh): a TLS port that requires client certificates, the
// default user off, and an admin who makes each test's ACL users.

// secured is the secured instance as one test sees it.
type secured struct {
	addr  string
	certs *testenv.SecureCerts
	admin *redis.Client
}

func newSecured(t *testing.T) *secured {
	t.Helper()
	addr := testenv.RedisTLSAddr()
	testenv.Require(t, addr)
	certs := testenv.Secure(t)
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(certs.CA)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("reading the CA %s: %v", certs.CA, err)
	}
	kp, err := tls.LoadX509KeyPair(certs.AdminCert, certs.AdminKey)
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{
		Addr: addr, Username: "admin", Password: testenv.AdminPassword(), MaxRetries: -1,
		TLSConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}, ServerName: "127.0.0.1"},
	})
	t.Cleanup(func() { admin.Close() })
	// The scripts hold back names a server younger than their TTL may
	// have forgotten (the restart delay, on here): let it be older than
	// the TTLs of these tests, which are at most 3s.
	ctx := testCtx(t)
	for {
		info, err := admin.Info(ctx, "server").Result()
		if err != nil {
			t.Fatalf("INFO as admin: %v", err)
		}
		var up int
		if i := strings.Index(info, "uptime_in_seconds:"); i >= 0 {
			fmt.Sscanf(info[i+len("uptime_in_seconds:"):], "%d", &up)
		}
		if up >= 5 {
			break
		}
		time.Sleep(time.Second) // bounded by ctx's minute
	}
	return &secured{addr: addr, certs: certs, admin: admin}
}

// user makes an ACL user with rules (after "on >password") for the rest of
// the test, and returns its name and password.
func (s *secured) user(t *testing.T, rules string) (name, pw string) {
	t.Helper()
	name, pw = "lockertest-"+randHex(6), "pw-"+randHex(8)
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + pw}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	if err := s.admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s: %v", rules, err)
	}
	t.Cleanup(func() { s.admin.Do(context.Background(), "ACL", "DELUSER", name) })
	return name, pw
}

// url is a rediss URL for user:pw with the client certificate; kv are more
// query parameters.
func (s *secured) url(user, pw string, kv ...string) string {
	q := url.Values{"ca": {s.certs.CA}, "cert": {s.certs.ClientCert}, "key": {s.certs.ClientKey}}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u := url.URL{Scheme: "rediss", Host: s.addr, Path: "/0", RawQuery: q.Encode()}
	if user != "" || pw != "" {
		u.User = url.UserPassword(user, pw)
	}
	return u.String()
}

// client opens a Client on the secured instance as user, in namespace ns,
// with the default restart delay (so the scripts call INFO as they do in
// production).
func (s *secured) client(ctx context.Context, user, pw, ns string, fair bool, opts ...any) (*locker.Client, error) {
	var dopts []Option
	copts := []locker.Option{locker.WithNamespace(ns)}
	for _, o := range opts {
		switch o := o.(type) {
		case Option:
			dopts = append(dopts, o)
		case locker.Option:
			copts = append(copts, o)
		}
	}
	dopts = append([]Option{withTTLRestartDelay()}, dopts...)
	var d backend.Driver
	var err error
	if fair {
		d, err = OpenFair(ctx, s.url(user, pw), dopts...)
	} else {
		d, err = Open(ctx, s.url(user, pw), dopts...)
	}
	if err != nil {
		return nil, err
	}
	c, err := locker.New(d, copts...)
	if err != nil {
		d.Close()
		return nil, err
	}
	return c, nil
}

// TLS from the URL on the secured instance: the CA and the client
// certificate (CN=locker) from ca=, cert=, key=; the user from the URL.
func TestSecureTLSFromURL(t *testing.T) {
	s := newSecured(t)
	ctx := testCtx(t)
	user, pw := s.user(t, "~* &* +@all")
	for _, u := range []string{
		s.url(user, pw),
		s.url(user, pw, "server_name", "localhost"),
		strings.Replace(s.url(user, pw), "rediss://", "redis://", 1), // ca= alone turns TLS on
	} {
		d, err := Open(ctx, u)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Minute}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Errorf("TryAcquire: %v", err)
		} else if err := d.Release(ctx, l); err != nil {
			t.Errorf("Release: %v", err)
		}
		d.Close()
	}
}

// A client certificate from another CA, or none, is refused at Open within
// a second, with an error that says it is TLS; so is a server certificate
// that the given CA did not sign.
func TestSecureTLSRefused(t *testing.T) {
	s := newSecured(t)
	other := testenv.NewCerts(t)
	user, pw := s.user(t, "~* &* +@all")
	base, _ := url.Parse(s.url(user, pw))
	with := func(kv ...string) string {
		u := *base
		q := u.Query()
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				q.Del(kv[i])
			} else {
				q.Set(kv[i], kv[i+1])
			}
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	for _, c := range []struct {
		what, url string
	}{
		{"client certificate from another CA", with("cert", other.ClientCert, "key", other.ClientKey)},
		{"no client certificate", with("cert", "", "key", "")},
		{"server certificate from another CA", with("ca", other.CA)},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		d, err := Open(ctx, c.url)
		took := time.Since(start)
		cancel()
		if err == nil {
			d.Close()
			t.Errorf("%s: Open succeeded", c.what)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "tls") && !strings.Contains(msg, "x509") || errors.Is(err, context.DeadlineExceeded) || took > time.Second {
			t.Errorf("%s: after %v: %v; want an error that names TLS, within a second", c.what, took, err)
		}
		t.Logf("%s: %v (%v)", c.what, err, took.Round(time.Millisecond))
	}
}

// A wrong password is refused with ErrPermission, at Open, within a second;
// a URL that names a user without a password is refused before any
// connection (go-redis would run it as the default user); no secret shows.
func TestSecureCredentials(t *testing.T) {
	s := newSecured(t)
	user, pw := s.user(t, "~* &* +@all")
	const canary = "Canary-" + "Pw-83jd"
	for _, c := range []struct {
		what, url string
		want      error
	}{
		{"wrong password", s.url(user, canary), backend.ErrPermission},
		{"unknown user", s.url("nobody-"+randHex(4), canary), backend.ErrPermission},
		{"no user", s.url("", canary), backend.ErrPermission},
		{"no password", strings.Replace(s.url(user, pw), ":"+pw+"@", "@", 1), backend.ErrInvalidURL},
		{"empty password", strings.Replace(s.url(user, pw), ":"+pw+"@", ":@", 1), backend.ErrInvalidURL},
	} {
		for _, fair := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			var err error
			if fair {
				var d *FairDriver
				if d, err = OpenFair(ctx, c.url); err == nil {
					d.Close()
				}
			} else {
				var cl *locker.Client
				if cl, err = locker.Open(ctx, strings.Replace(c.url, "/0?", "/0?namespace=x&", 1)); err == nil {
					cl.Close()
				}
			}
			took := time.Since(start)
			cancel()
			if !errors.Is(err, c.want) || took > time.Second {
				t.Errorf("%s (fair=%v): after %v: %v; want %v within a second", c.what, fair, took, err, c.want)
			}
			if err != nil && (strings.Contains(err.Error(), canary) || strings.Contains(err.Error(), pw)) {
				t.Errorf("%s: the error shows the password: %v", c.what, err)
			}
		}
	}
}

// No secret in any message: canary passwords in the user info and in query
// parameters appear in no error and no log line, whatever fails.
func TestSecureNoSecretInMessages(t *testing.T) {
	s := newSecured(t)
	const canary = "Canary-" + "Secret-5Hq"
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	bad := s.url("admin", canary)
	for _, u := range []string{
		bad, // wrong password
		bad + "&password=" + canary,
		bad + "&sslpassword=" + canary,
		bad + "&fair=maybe",
		bad + "&client_token=" + canary,
		strings.Replace(bad, "rediss://", "rediss+quorum://", 1),
		strings.Replace(bad, "rediss://", "rediss+cluster://", 1),
		strings.Replace(bad, s.addr, "127.0.0.1:1", 1), // unreachable
		strings.Replace(bad, "/0?", "/0?namespace=x&", 1),
	} {
		ctx, cancel := context.WithTimeout(backend.WithLogger(context.Background(), log), 3*time.Second)
		c, err := locker.Open(ctx, u, locker.WithLogger(log))
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open succeeded with a wrong password")
			continue
		}
		if strings.Contains(err.Error(), canary) {
			t.Errorf("the error shows a secret: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), canary) {
		t.Errorf("the log shows a secret:\n%s", logs.String())
	}
}

// checkACLCorrect ensures that ACL's rules say what the doc says: the key
// patterns cover the real key names of the namespace, and only them.
func TestACLPatterns(t *testing.T) {
	for _, ns := range []string{"locker", "my.app", "a-b_c"} {
		rules := ACL(ns, true)
		var keys, chans []string
		for _, r := range strings.Fields(rules) {
			switch {
			case strings.HasPrefix(r, "~"):
				keys = append(keys, r[1:])
			case strings.HasPrefix(r, "&"):
				chans = append(chans, r[1:])
			}
		}
		k := backend.Key(ns, "job/1 {x}")
		ks := keysFor(k)
		for _, name := range []string{ks.lock, ks.fence, ks.queue, ks.live} {
			if !globAny(keys, name) {
				t.Errorf("%s: no key pattern of %q matches %q", ns, rules, name)
			}
		}
		if !globAny(chans, ks.channel) {
			t.Errorf("%s: no channel pattern of %q matches %q", ns, rules, ks.channel)
		}
		for _, other := range []string{keysFor(backend.Key(ns+"x", "a")).lock, "{" + ns + "}:lock", ns + "/a"} {
			if globAny(keys, other) {
				t.Errorf("%s: a key pattern of %q matches %q, outside the namespace", ns, rules, other)
			}
		}
	}
}

// globAny matches Redis's glob for the patterns ACL makes: '*' is the only
// special character in them.
func globAny(patterns []string, s string) bool {
	for _, p := range patterns {
		parts := strings.Split(p, "*")
		if !strings.HasPrefix(s, parts[0]) {
			continue
		}
		rest, ok := s[len(parts[0]):], true
		for i, part := range parts[1:] {
			if i == len(parts)-2 {
				ok = strings.HasSuffix(rest, part)
				break
			}
			j := strings.Index(rest, part)
			if j < 0 {
				ok = false
				break
			}
			rest = rest[j+len(part):]
		}
		if ok {
			return true
		}
	}
	return false
}

// Least privilege: a user with exactly ACL(ns, fair) acquires, refreshes,
// releases, and a waiter is woken by the release; with any one rule less,
// the step that needs it fails with ErrPermission within a second, not
// after retries.
func TestSecureLeastPrivilege(t *testing.T) {
	s := newSecured(t)
	for _, fair := range []bool{false, true} {
		t.Run(modeName(fair), func(t *testing.T) {
			ns := "sec-" + randHex(4)
			rules := ACL(ns, fair)
			user, pw := s.user(t, rules)
			if err := runLockCycle(t, s, user, pw, ns, fair, true); err != nil {
				t.Fatalf("with ACL %q: %v", rules, err)
			}
			for _, r := range strings.Fields(rules) {
				switch r {
				case "resetkeys", "resetchannels", "-@all":
					continue
				case "+incr":
					// A quorum's acquire script needs it; a single
					// server's lock scripts no longer do.
					continue
				case "+exists", "+mget":
					if fair {
						continue // the default mode's release and sets need them
					}
				case "+publish", "+subscribe", "+unsubscribe":
					// Not refused by design: a release whose wake-up the
					// ACL refuses succeeds and logs it, a waiter that cannot
					// subscribe polls (TestSecurePublishDenied), and an
					// UNSUBSCRIBE refused leaves a channel subscribed.
					continue
				}
				if strings.HasPrefix(r, "&") {
					continue // the same as +publish and +subscribe
				}
				less := strings.Join(strings.Fields(strings.Replace(" "+rules+" ", " "+r+" ", " ", 1)), " ")
				user, pw := s.user(t, less)
				if r == "+eval" {
					// EVAL is the fallback when the server has not the
					// script: make it so.
					if err := s.admin.ScriptFlush(testCtx(t)).Err(); err != nil {
						t.Fatal(err)
					}
				}
				err := runLockCycle(t, s, user, pw, ns, fair, false)
				if !errors.Is(err, locker.ErrPermission) {
					t.Errorf("without %s: %v, want ErrPermission", r, err)
				} else {
					t.Logf("without %s: %v", r, err)
				}
			}
		})
	}
}

// runLockCycle acquires a name, refreshes it, has a second Client wait for
// it, releases it, and waits for the waiter to get it, woken by the
// release. It returns the first error, which must come within a second of
// the step that failed; full says that every step must work.
func runLockCycle(t *testing.T, s *secured, user, pw, ns string, fair, full bool) error {
	ctx := testCtx(t)
	timed := func(what string, f func() error) error {
		start := time.Now()
		err := f()
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s took %v (%v)", what, took, err)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	var c1, c2 *locker.Client
	if err := timed("Open", func() (err error) {
		if c1, err = s.client(ctx, user, pw, ns, fair); err != nil {
			return err
		}
		// Polls at least 500ms apart: a waiter that gets the lock sooner
		// after the release was woken by it.
		c2, err = s.client(ctx, user, pw, ns, fair, locker.WithBackoff(time.Second, time.Second))
		return err
	}); err != nil {
		if c1 != nil {
			c1.Close()
		}
		return err
	}
	defer c1.Close()
	defer c2.Close()
	name := "job-" + randHex(4)
	var l *locker.Lock
	if err := timed("Acquire", func() (err error) {
		l, err = c1.Acquire(ctx, name, locker.TTL(3*time.Second))
		return err
	}); err != nil {
		return err
	}
	if err := timed("Refresh", func() error { return l.Refresh(ctx) }); err != nil {
		return err
	}
	type result struct {
		l   *locker.Lock
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	waitStart := time.Now()
	go func() {
		w, err := c2.Acquire(wctx, name, locker.TTL(3*time.Second))
		got <- result{w, err, time.Now()}
	}()
	// Long enough for the waiter to queue and subscribe, and for the
	// backoff (at most 250ms) to be longer than a wake-up.
	select {
	case r := <-got:
		if r.err == nil {
			return fmt.Errorf("the waiter got the held lock")
		}
		if took := r.at.Sub(waitStart); took > time.Second {
			t.Errorf("the waiter's Acquire failed after %v", took)
		}
		return fmt.Errorf("waiting Acquire: %w", r.err)
	case <-time.After(1500 * time.Millisecond):
	}
	released := time.Now()
	if err := timed("Release", func() error { return l.Release(ctx) }); err != nil {
		// A failed release must not have deleted the key: its error says
		// the lock expires after its TTL.
		if n, _ := s.admin.Exists(ctx, keysFor(backend.Key(ns, name)).lock).Result(); n != 1 {
			t.Errorf("Release failed (%v) but deleted the key", err)
		}
		return err
	}
	r := <-got
	if r.err != nil {
		return fmt.Errorf("waiting Acquire: %w", r.err)
	}
	// Woken, not polling: a queued waiter renews every 2s/3.
	if took := r.at.Sub(released); full && took > 150*time.Millisecond {
		t.Errorf("the waiter got the lock %v after the release: not woken by it", took)
	}
	// With no one waiting, a release deletes the key.
	if err := timed("the waiter's Release", func() error { return r.l.Release(ctx) }); err != nil {
		return err
	}
	// A set of names: one script each way in the default mode.
	var set *locker.LockSet
	if err := timed("TryAcquireAll", func() (err error) {
		set, err = c1.TryAcquireAll(ctx, []string{name, name + "-b"}, locker.TTL(3*time.Second))
		return err
	}); err != nil {
		return err
	}
	return timed("the set's Release", func() error { return set.Release(ctx) })
}

// A principal without rights to the lock keys cannot acquire, refresh or
// release another's lock, nor delete its key: ErrPermission, and the
// holder keeps the lock.
func TestSecureNoRightsToKeys(t *testing.T) {
	s := newSecured(t)
	ctx := testCtx(t)
	ns := "sec-" + randHex(4)
	user, pw := s.user(t, ACL(ns, false))
	// Every command, but the keys and channels of another namespace.
	outsider, opw := s.user(t, "~other:* &other:* +@all")
	c, err := s.client(ctx, user, pw, ns, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "job", locker.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	key := backend.Key(ns, "job")
	value, err := s.admin.Get(ctx, keysFor(key).lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The outsider even knows the token: the ACL alone must stop it.
	stolen := backend.Claim{Key: key, Token: strings.Split(value, ".")[0], TTL: time.Minute}
	for _, fair := range []bool{false, true} {
		var d backend.Driver
		if fair {
			d, err = OpenFair(ctx, s.url(outsider, opw))
		} else {
			d, err = Open(ctx, s.url(outsider, opw))
		}
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for what, f := range map[string]func() error{
			"TryAcquire": func() error {
				_, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: newToken(), TTL: time.Minute})
				return err
			},
			"Refresh": func() error { return d.Refresh(ctx, stolen) },
			"Release": func() error { return d.Release(ctx, stolen) },
			"DEL": func() error {
				return d.(interface{ Client() redis.UniversalClient }).Client().Del(ctx, keysFor(key).lock).Err()
			},
			"SET": func() error {
				return d.(interface{ Client() redis.UniversalClient }).Client().Set(ctx, keysFor(key).lock, "x", 0).Err()
			},
		} {
			if fair && (what == "DEL" || what == "SET") {
				continue
			}
			start := time.Now()
			err := f()
			if !errors.Is(classify(err), backend.ErrPermission) || time.Since(start) > time.Second {
				t.Errorf("fair=%v: %s of another's lock: %v after %v, want ErrPermission at once", fair, what, err, time.Since(start))
			}
		}
	}
	if v, err := s.admin.Get(ctx, keysFor(key).lock).Result(); err != nil || v != value {
		t.Fatalf("the lock key is %q (%v), want the holder's %q", v, err, value)
	}
	if err := l.Refresh(ctx); err != nil {
		t.Fatalf("the holder's Refresh: %v", err)
	}
}

// Theft: a principal with rights to the keys deletes or overwrites a held
// lock's key. The holder's Lost fires by the end of the first refresh sent
// after the theft, which the watchdog sends at most TTL/3 after the one
// before it: within TTL/3 and a round trip of the theft.
func TestSecureTheftIsNoticed(t *testing.T) {
	s := newSecured(t)
	ctx := testCtx(t)
	ns := "sec-" + randHex(4)
	user, pw := s.user(t, ACL(ns, false))
	thief, tpw := s.user(t, ACL(ns, false)+" +@all")
	tc := redis.NewClient(&redis.Options{Addr: s.addr, Username: thief, Password: tpw, TLSConfig: s.admin.Options().TLSConfig, MaxRetries: -1})
	defer tc.Close()
	const ttl = 1200 * time.Millisecond
	d, err := Open(ctx, s.url(user, pw))
	if err != nil {
		t.Fatal(err)
	}
	spy := &testenv.RefreshSpy{Driver: d}
	c, err := locker.New(spy, locker.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var worst time.Duration
	// The last two steal right after a refresh was answered: the worst
	// case, a whole TTL/3 before the next.
	for i, theft := range []string{"DEL", "SET", "DEL", "SET", "DEL", "SET", "DEL", "SET"} {
		name := fmt.Sprintf("job-%d", i)
		l, err := c.Acquire(ctx, name, locker.TTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		if i < 6 {
			// Steal at a different phase of the refresh cycle each time.
			time.Sleep(ttl/2 + time.Duration(i)*ttl/9)
		} else {
			spy.WaitRefreshed(t, time.Now())
		}
		key := keysFor(backend.Key(ns, name)).lock
		at := time.Now()
		if theft == "DEL" {
			err = tc.Del(ctx, key).Err()
		} else {
			err = tc.Set(ctx, key, "thief", 0).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
		worst = max(worst, spy.ExpectLost(t, theft, l.Lost(), at, ttl))
		if !errors.Is(l.Err(), locker.ErrLost) {
			t.Errorf("%s: Err() = %v", theft, l.Err())
		}
		if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
			t.Errorf("%s: Release after the theft = %v, want ErrNotHeld", theft, err)
		}
		if theft == "SET" {
			if v, _ := tc.Get(ctx, key).Result(); v != "thief" {
				t.Errorf("the holder's release removed the thief's key (%q)", v)
			}
		}
	}
	t.Logf("TTL %v: worst time from theft to Lost %v (TTL/3 = %v)", ttl, worst.Round(time.Millisecond), ttl/3)
}

// Release when the ACL refuses the wake-up (Redis 7's resetchannels): the
// key is gone, Release succeeds, the refusal is logged once, and a waiter
// gets the lock by polling.
func TestSecurePublishDenied(t *testing.T) {
	s := newSecured(t)
	ctx := testCtx(t)
	for _, fair := range []bool{false, true} {
		ns := "sec-" + randHex(4)
		user, pw := s.user(t, aclWithout(ns, fair, func(r string) bool { return strings.HasPrefix(r, "&") }))
		var logs logBuf
		c, err := s.client(ctx, user, pw, ns, fair, WithLogger(logs.logger()))
		if err != nil {
			t.Fatal(err)
		}
		w, err := s.client(ctx, user, pw, ns, fair)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			name := fmt.Sprintf("job-%d", i)
			l, err := c.Acquire(ctx, name, locker.TTL(3*time.Second))
			if err != nil {
				t.Fatalf("fair=%v: Acquire: %v", fair, err)
			}
			got := make(chan error, 1)
			go func() {
				l, err := w.Acquire(ctx, name, locker.TTL(3*time.Second))
				if err == nil {
					err = l.Release(ctx)
				}
				got <- err
			}()
			time.Sleep(300 * time.Millisecond)
			lockKey := keysFor(backend.Key(ns, name)).lock
			before, err := s.admin.Get(ctx, lockKey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("fair=%v: Release without channel permission = %v, want success", fair, err)
			}
			// Deleted (fair), or handed to the queued waiter (default): no
			// longer the releaser's either way.
			if v, err := s.admin.Get(ctx, lockKey).Result(); err == nil && strings.HasPrefix(v, attemptOf(before)) {
				t.Fatalf("fair=%v: the releaser's lock is still there (%q)", fair, v)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("fair=%v: the waiter: %v", fair, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("fair=%v: the waiter did not get the released lock within 5s", fair)
			}
		}
		c.Close()
		w.Close()
		if n := logs.count("refuses PUBLISH"); n != 1 {
			t.Errorf("fair=%v: %d warnings about the refused wake-up, want one:\n%s", fair, n, &logs)
		}
	}
}

// aclWithout is ACL(ns, fair) less the rules drop matches.
func aclWithout(ns string, fair bool, drop func(rule string) bool) string {
	var rules []string
	for _, r := range strings.Fields(ACL(ns, fair)) {
		if !drop(r) {
			rules = append(rules, r)
		}
	}
	return strings.Join(rules, " ")
}

// attemptOf is a lock value's "<token>.<attempt>" (see value.lua).
func attemptOf(v string) string {
	a, _, _ := strings.Cut(v, ":")
	return a
}
