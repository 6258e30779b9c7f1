package mysql

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
	"github.com/lockerhq/locker/sqllock/sqldb"
)

// Bad URLs and options are typed errors before any network call, and no
// message quotes the password.
func TestBadURLsFailBeforeDialling(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dialled atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	host := ln.Addr().String()
	const secret = "s3cr3t-pw"
	for _, raw := range []string{
		"mysql://app:" + secret + "@" + host + "/db?nope=1",
		"mysql://app:" + secret + "@" + host + "/db?lock_table=",
		"mysql://app:" + secret + "@" + host + "/db?lock_table=a%00b",
		"mysql://app:" + secret + "@" + host + "/db?create_table=maybe",
		"mysql://app:" + secret + "@" + host + "/db?retention=0s",
		"mysql://app:" + secret + "@" + host + "/db?retention=soon",
		"mysql://app:" + secret + "@" + host + "/db?connect_timeout=soon",
		"mysql://app:" + secret + "@" + host + "/db?connect_timeout=-1s",
		"mysql://app:" + secret + "@" + host + "/db?ca=/nonexistent/ca.pem",
		"mysql://app:" + secret + "@" + host + "/db?interpolateParams=false",
		"mysql://app:" + secret + "@" + host + "/",
		"mysql://app:" + secret + "@" + host + "/a/b",
		"mysql://app:" + secret + "@" + host + "," + host + "/db",
		"mysql://app:" + secret + "@/db",
		"postgres://app:" + secret + "@" + host + "/db",
		"mysql://app:" + secret + "@" + host + "/db?%zz",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := Open(ctx, raw)
		cancel()
		if err == nil {
			d.Close()
			t.Errorf("Open(%s) succeeded", backend.RedactedString(raw))
			continue
		}
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("Open(%s) = %v, want ErrInvalidURL", backend.RedactedString(raw), err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s)'s error quotes the password: %v", backend.RedactedString(raw), err)
		}
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("%d connections to the server for bad URLs, want none", n)
	}
	// Options given to Open are ErrInvalidOption.
	if _, err := Open(context.Background(), "mysql://app@"+host+"/db", sqldb.WithTable("bad\nname")); !errors.Is(err, backend.ErrInvalidOption) {
		t.Errorf("Open with a bad WithTable = %v, want ErrInvalidOption", err)
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("%d connections to the server for a bad option, want none", n)
	}
}

// A wrong password is ErrPermission, and says nothing of the password.
func TestWrongPasswordIsPermission(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(sqltest.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	const wrong = "not-the-password-42"
	u.User = url.UserPassword(u.User.Username(), wrong)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Open(ctx, u.String())
	if err == nil {
		d.Close()
		t.Fatal("Open with a wrong password succeeded")
	}
	if !errors.Is(err, backend.ErrPermission) || !backend.Permanent(err) {
		t.Errorf("Open with a wrong password = %v, want ErrPermission", err)
	}
	if strings.Contains(err.Error(), wrong) {
		t.Errorf("the error quotes the password: %v", err)
	}
}

// The password may come from MYSQL_PWD, as with the mysql client; the
// URL's wins.
func TestPasswordFromEnvironment(t *testing.T) {
	u, err := url.Parse(sqltest.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok {
		t.Skip("the test server's URL has no password")
	}
	t.Setenv("MYSQL_PWD", pw)
	u.User = url.User(u.User.Username())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Open(ctx, u.String())
	if err != nil {
		t.Fatalf("Open with the password in MYSQL_PWD: %v", err)
	}
	d.Close()
	t.Setenv("MYSQL_PWD", "wrong")
	u.User = url.UserPassword(u.User.Username(), pw)
	if d, err = Open(ctx, u.String()); err != nil {
		t.Fatalf("Open with the password in the URL and a wrong MYSQL_PWD: %v", err)
	}
	d.Close()
}

// locker.Open finds the scheme.
func TestRegistered(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := newHarness(t, false)
	c, err := locker.Open(ctx, h.url)
	if err != nil {
		t.Fatalf("locker.Open: %v", err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "registered")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
