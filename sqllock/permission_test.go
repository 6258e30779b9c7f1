package sqllock

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// A role that may connect but not use the lock table gets ErrPermission at
// once: a blocking Acquire does not wait it out as a transient error.
func TestPermissionErrorsArePermanent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := adminPool(t)
	table := testTable(t, admin, "")
	// The table exists, made by the owner.
	owner, err := Open(ctx, withParams(t, baseURL(t), paramTable, table))
	if err != nil {
		t.Fatal(err)
	}
	owner.Close()
	role := "lockertest_" + randHex(6)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	u, err := url.Parse(withParams(t, baseURL(t), paramTable, table, paramCreate, "false"))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	c, err := locker.Open(ctx, u.String())
	if err != nil {
		if !errors.Is(err, backend.ErrPermission) {
			t.Fatalf("Open as a role without grants = %v, want success or ErrPermission", err)
		}
		t.Logf("Open: %v", err)
		return
	}
	defer c.Close()
	start := time.Now()
	_, err = c.Acquire(ctx, "x")
	if !errors.Is(err, locker.ErrPermission) {
		t.Fatalf("Acquire without grants = %v, want ErrPermission", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Acquire took %v to report a permission error: it retried it as transient", took)
	}
	if strings.Count(err.Error(), "permission denied") != 1 || strings.Count(err.Error(), "not permitted") != 1 {
		t.Fatalf("the error repeats itself: %v", err)
	}
	t.Logf("Acquire: %v", err)
}
