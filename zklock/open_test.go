package zklock

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url     string
		servers []string
		root    string
		st      time.Duration
		auth    bool
	}{
		{"zk://127.0.0.1:2181", []string{"127.0.0.1:2181"}, DefaultRoot, DefaultSessionTimeout, false},
		{"zk://a:1,b,c:3/", []string{"a:1", "b:2181", "c:3"}, DefaultRoot, DefaultSessionTimeout, false},
		{"zk://u:p@h:2181/app/locks?session_timeout=3s&connect_timeout=1s", []string{"h:2181"}, "/app/locks", 3 * time.Second, true},
		{"zk://[::1]/x", []string{"[::1]:2181"}, "/x", DefaultSessionTimeout, false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		servers, opts, err := parseURL(u)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		cfg := defaults(opts)
		if strings.Join(servers, " ") != strings.Join(tc.servers, " ") || cfg.root != tc.root || cfg.sessionTimeout != tc.st || cfg.hasAuth != tc.auth {
			t.Errorf("%s: servers %v root %q timeout %v auth %v", tc.url, servers, cfg.root, cfg.sessionTimeout, cfg.hasAuth)
		}
	}
	for _, bad := range []string{
		"zk://h:2181/x?session_timeout=soon",
		"zk://h:2181/x?sesion_timeout=1s",
		"zk://h:2181/x?session_timeout=0s",
		"zk://h:2181/a//b",
		"zk://h:2181/a/../b",
		"zk://h:2181/a/",
		"zk://h:2181/zookeeper/x",
		"zk://h:2181,,h2:2181/x",
		"zk:///x",
		"zk://user@h:2181/x",
		"redis://h:6379",
	} {
		u, err := url.Parse(bad)
		if err != nil {
			t.Fatalf("%s: %v", bad, err)
		}
		if _, _, err := parseURL(u); !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("%s: %v, want ErrInvalidURL", bad, err)
		}
	}
}

func TestOpenUnreachableFailsFast(t *testing.T) {
	t.Parallel()
	start := time.Now()
	_, err := locker.Open(context.Background(), "zk://alice:hunter2@127.0.0.1:1/x?connect_timeout=500ms")
	if err == nil {
		t.Fatal("opened a driver on a closed port")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the password is in the error: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := locker.Open(ctx, "zk://127.0.0.1:1/x"); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Open past its context's deadline = %v", err)
	}
}

func TestOpenURL(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddrs()[0]
	testenv.Require(t, addr)
	ctx := context.Background()
	c, err := locker.Open(ctx, "zk://bob:pw@"+addr+"/locker-test/open?session_timeout=1500ms&namespace=open-test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := c.Driver().(*Driver)
	if d.SessionTTL() != 1500*time.Millisecond {
		t.Errorf("SessionTTL %v, want the negotiated 1.5s", d.SessionTTL())
	}
	l, err := c.TryAcquire(ctx, "a/b", locker.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 1500*time.Millisecond || l.Fence() == 0 {
		t.Errorf("TTL %v fence %d", l.TTL(), l.Fence())
	}
	acl, _, err := d.conn.GetACL(d.parentPath(backend.Key("open-test", "a/b")))
	if err != nil || len(acl) != 2 || acl[0].Scheme != "digest" {
		t.Errorf("ACL %+v, %v", acl, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The server clamps what it is asked for.
	c2, err := locker.Open(ctx, "zk://"+addr+"/locker-test?session_timeout=10ms")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := c2.Driver().(*Driver).SessionTTL(); got != time.Second {
		t.Errorf("SessionTTL %v for a 10ms request, want the server's minimum, 1s", got)
	}
}

// TestNewWithUserConn: the driver uses a connection the caller built, and
// leaves it open.
func TestNewWithUserConn(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	conn, _, err := zk.Connect(servers, 3*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A fresh connection: New waits for its session, and learns its
	// timeout from the server.
	d, err := New(conn, WithRoot("/locker-test"))
	if err != nil {
		t.Fatal(err)
	}
	if d.SessionTTL() != 3*time.Second {
		t.Errorf("SessionTTL %v, want 3s", d.SessionTTL())
	}
	if d2, err := New(conn, WithRoot("/locker-test"), WithSessionTimeout(2500*time.Millisecond)); err != nil {
		t.Error(err)
	} else {
		if d2.SessionTTL() != 2500*time.Millisecond {
			t.Errorf("SessionTTL %v, want WithSessionTimeout's 2.5s", d2.SessionTTL())
		}
		d2.Close()
	}
	other := dial(t, servers)
	key := uniqueKey(t)
	l := lockFor(t, key)
	lost := make(chan error, 1)
	l.OnLost = func(err error) { lost <- err }
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, lockFor(t, key)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Close deleted the lock's node and left the connection open.
	if n := entries(t, other, key); n != 0 {
		t.Errorf("%d nodes after Close", n)
	}
	if _, _, err := conn.Exists("/"); err != nil {
		t.Errorf("the caller's connection after Close: %v", err)
	}
	if err := d.Close(); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("second Close = %v", err)
	}
	if _, err := d.TryAcquire(ctx, lockFor(t, key)); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("TryAcquire after Close = %v", err)
	}
	select {
	case err := <-lost:
		t.Errorf("OnLost fired on Close: %v", err)
	default:
	}
}

// TestNewNoSession: New on a connection that gets no session fails within
// the connect timeout.
func TestNewNoSession(t *testing.T) {
	t.Parallel()
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, 3*time.Second, zk.WithLogInfo(false), zk.WithLogger(zkLogger{l: slog.New(slog.DiscardHandler)}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_, err = New(conn, WithConnectTimeout(300*time.Millisecond), WithSessionTimeout(3*time.Second))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("New without a session = %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("New took %v, want about the 300ms connect timeout", took)
	}
}

// TestSessionTimeoutSources: each way the driver learns the negotiated
// timeout works against the server (a go-zookeeper upgrade that changes its
// handshake report shows here, not as a silent fallback).
func TestSessionTimeoutSources(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	hs := newHandshake()
	conn, _, err := zk.Connect(servers, 10*time.Millisecond, zk.WithLogInfo(true), zk.WithLogger(zkLogger{l: slog.New(slog.DiscardHandler), hs: hs}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitSession(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := hs.reported(ctx, time.Second); got != time.Second {
		t.Errorf("the handshake report: %v for a 10ms request, want the server's minimum, 1s", got)
	}
	if got := consTimeout(ctx, conn); got != time.Second {
		t.Errorf("cons: %v, want 1s", got)
	}
}

// TestSessionTimeoutFollowsTTL: without session_timeout, the session
// timeout is the Client's default TTL, clamped by the server; Lock.TTL
// reports what the server granted.
func TestSessionTimeoutFollowsTTL(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddrs()[0]
	testenv.Require(t, addr)
	base := "zk://" + addr + "/locker-test?namespace=ttl-" + newToken(t)[:8]
	for _, tc := range []struct {
		name    string
		query   string
		opts    []locker.Option
		lockTTL time.Duration // 0: the Client's default
		session time.Duration // SessionTTL
		lock    time.Duration // Lock.TTL
		cut     bool          // the server grants less than asked for
	}{
		{"url ttl", "&ttl=2s", nil, 0, 2 * time.Second, 2 * time.Second, false},
		{"WithDefaultTTL", "", []locker.Option{locker.WithDefaultTTL(1500 * time.Millisecond)}, 0, 1500 * time.Millisecond, 1500 * time.Millisecond, false},
		{"session_timeout wins", "&ttl=2s&session_timeout=3s", nil, 0, 3 * time.Second, 3 * time.Second, false},
		{"below the server's minimum", "&ttl=300ms", nil, 0, time.Second, time.Second, false},
		{"above the server's maximum", "&ttl=720h", nil, 0, time.Minute, 720 * time.Hour, true},
		{"longer lock TTL", "&ttl=1500ms", nil, 5 * time.Second, 1500 * time.Millisecond, 5 * time.Second, false},
		{"no ttl", "", nil, 0, DefaultSessionTimeout, locker.DefaultTTL, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var logs bytes.Buffer
			opts := append([]locker.Option{locker.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}, tc.opts...)
			c, err := locker.Open(ctx, base+tc.query, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got := c.Driver().(*Driver).SessionTTL()
			if got != tc.session {
				t.Errorf("SessionTTL %v, want %v", got, tc.session)
			}
			// A session shorter than asked for is said, once, at Warn.
			want := 0
			if tc.cut {
				want = 1
			}
			if n := strings.Count(logs.String(), "level=WARN"); n != want {
				t.Errorf("%d warnings, want %d:\n%s", n, want, &logs)
			}
			var lopts []locker.LockOption
			if tc.lockTTL > 0 {
				lopts = append(lopts, locker.TTL(tc.lockTTL))
			}
			l, err := c.TryAcquire(ctx, "k", lopts...)
			if err != nil {
				t.Fatal(err)
			}
			if l.TTL() != tc.lock {
				t.Errorf("Lock.TTL %v, want %v", l.TTL(), tc.lock)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOpenOptionOverridesDefaultTTL: Open's options apply after what the
// context's default TTL implies.
func TestOpenOptionOverridesDefaultTTL(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddrs()[0]
	testenv.Require(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = backend.WithDefaultTTL(ctx, 2*time.Second)
	d, err := Open(ctx, "zk://"+addr+"/locker-test")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.SessionTTL() != 2*time.Second {
		t.Errorf("SessionTTL %v, want the context's 2s", d.SessionTTL())
	}
	d2, err := Open(ctx, "zk://"+addr+"/locker-test", WithSessionTimeout(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if d2.SessionTTL() != 1500*time.Millisecond {
		t.Errorf("SessionTTL %v, want WithSessionTimeout's 1.5s", d2.SessionTTL())
	}
}

// A nil connection is refused before anything else, with ErrInvalidOption.
func TestNewNilConn(t *testing.T) {
	if d, err := New(nil); !errors.Is(err, backend.ErrInvalidOption) || d != nil {
		t.Errorf("New(nil) = %v, %v; want ErrInvalidOption", d, err)
	}
}

// Dial's options out of range fail with ErrInvalidOption before any dial.
func TestDialBadOptions(t *testing.T) {
	ctx := context.Background()
	for name, f := range map[string]func() (*Driver, error){
		"no servers":        func() (*Driver, error) { return Dial(ctx, nil) },
		"relative root":     func() (*Driver, error) { return Dial(ctx, []string{"127.0.0.1:1"}, WithRoot("locks")) },
		"zero session":      func() (*Driver, error) { return Dial(ctx, []string{"127.0.0.1:1"}, WithSessionTimeout(0)) },
		"New relative root": func() (*Driver, error) { return New(&zk.Conn{}, WithRoot("locks")) },
	} {
		if d, err := f(); !errors.Is(err, backend.ErrInvalidOption) || d != nil {
			t.Errorf("%s = %v, %v; want ErrInvalidOption", name, d, err)
		}
	}
}
