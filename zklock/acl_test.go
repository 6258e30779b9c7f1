package zklock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A root or name node that someone else made with another ACL than the
// configured one (zkCli's `create` is world-writable) is refused: anyone
// could delete a holder's node under it. With the configured ACL, it is
// used.
func TestForeignACLIsRefused(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const user, pw = "locker", "Canary-zk-pw"
	admin, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := waitSession(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := admin.AddAuth("digest", []byte(user+":"+pw)); err != nil {
		t.Fatal(err)
	}
	base := "/locker-acl-" + newToken(t)[:8]
	if _, err := admin.Create(base, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	defer deleteTree(admin, base)
	world := base + "/world"
	if _, err := admin.Create(world, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	_, err = dialDriver(ctx, servers, WithRoot(world), WithDigestAuth(user, pw))
	if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), "world:anyone:cdrwa") || strings.Contains(err.Error(), pw) {
		t.Fatalf("Dial under a world-writable root = %v, want ErrPermission naming the ACL, without the password", err)
	}
	own := base + "/own"
	if _, err := admin.Create(own, nil, 0, DigestACL(user, pw)); err != nil {
		t.Fatal(err)
	}
	d, err := dialDriver(ctx, servers, WithRoot(own), WithDigestAuth(user, pw))
	if err != nil {
		t.Fatalf("Dial under a root with the configured ACL: %v", err)
	}
	defer d.Close()
	// A name node squatted with a world ACL, by someone with the right to
	// create under the root.
	squat := d.parentPath("squatted")
	if _, err := admin.Create(squat, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	_, err = d.TryAcquire(ctx, backend.Claim{Key: "squatted", Token: newToken(t), TTL: time.Second})
	if !errors.Is(err, backend.ErrPermission) || !strings.Contains(err.Error(), squat) {
		t.Fatalf("TryAcquire under a world-writable name node = %v, want ErrPermission naming it", err)
	}
	if kids, _, err := admin.Children(squat); err != nil || len(kids) != 0 {
		t.Fatalf("the refused acquisition left nodes behind: %v, %v", kids, err)
	}
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: "fresh", Token: newToken(t), TTL: time.Second}); err != nil {
		t.Fatalf("TryAcquire of a name whose node the driver makes: %v", err)
	}
}

// deleteTree deletes path and what is under it, best effort.
func deleteTree(conn *zk.Conn, path string) {
	kids, _, _ := conn.Children(path)
	for _, k := range kids {
		deleteTree(conn, path+"/"+k)
	}
	_ = conn.Delete(path, -1)
}
