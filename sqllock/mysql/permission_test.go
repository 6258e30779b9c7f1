package mysql

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A role with SELECT alone on the table opens, and is refused a lock with
// ErrPermission, never retried; with SELECT, INSERT, UPDATE and DELETE,
// the least privileges, it locks.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := newHarness(t, false)
	d, err := Open(ctx, h.url) // makes the table
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	user, pw := "lp_"+randHex(4), randHex(12)
	if _, err := h.admin.ExecContext(ctx, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, pw)); err != nil {
		t.Skipf("the test's user may not create users (%v): least privilege is for the TLS instance's tests", err)
	}
	t.Cleanup(func() { h.admin.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
	on := fmt.Sprintf("ON `%s`.`%s` TO '%s'@'%%'", db, h.table, user)
	if _, err := h.admin.ExecContext(ctx, "GRANT SELECT "+on); err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, pw)
	d, err = Open(ctx, u.String())
	if err != nil {
		t.Fatalf("Open with SELECT alone: %v", err)
	}
	defer d.Close()
	c := backend.Claim{Key: "lp/x", Token: randHex(16), TTL: time.Minute}
	if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrPermission) || !backend.Permanent(err) {
		t.Fatalf("TryAcquire with SELECT alone = %v, want ErrPermission", err)
	} else if strings.Contains(err.Error(), pw) {
		t.Fatalf("the error quotes the password: %v", err)
	}
	if _, err := h.admin.ExecContext(ctx, "GRANT INSERT, UPDATE, DELETE "+on); err != nil {
		t.Fatal(err)
	}
	g, err := d.TryAcquire(ctx, c)
	if err != nil {
		t.Fatalf("TryAcquire with SELECT, INSERT, UPDATE, DELETE: %v", err)
	}
	c.Fence = g.Fence
	if err := d.Refresh(ctx, c); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if errs := d.RefreshMany(ctx, []backend.Claim{c}); errs[0] != nil {
		t.Fatalf("RefreshMany: %v", errs[0])
	}
	if st, err := d.Inspect(ctx, c.Key); err != nil || !st.Held {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	if err := d.Release(ctx, c); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Close ends every connection Open made, and so each one's goroutine,
// which the conformance harness's leak checks pass over.
func TestCloseEndsConnections(t *testing.T) {
	h := newHarness(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := watchers()
	d, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 { // concurrent calls: several connections
		wg.Go(func() {
			c := backend.Claim{Key: fmt.Sprintf("close/%d", i), Token: randHex(16), TTL: time.Minute}
			if g, err := d.TryAcquire(ctx, c); err == nil {
				c.Fence = g.Fence
				d.Release(ctx, c)
			}
		})
	}
	wg.Wait()
	if watchers() <= before {
		t.Fatal("no connection goroutine while the driver is open: the check below checks nothing")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); watchers() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connection goroutines after Close, %d before Open", watchers(), before)
		}
	}
}

// watchers counts go-sql-driver's connection goroutines.
func watchers() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), watcherSite+".func1()")
}
