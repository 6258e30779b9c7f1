package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// A root or name node that existed before the driver needed it must carry
// exactly the configured ACL (see docs/backends/zklock.md, ACLs).

// checkACL returns an ErrPermission when the node at path exists with
// another ACL than the configured one.
func (d *Driver) checkACL(path string) error {
	acl, _, err := d.conn.GetACL(path)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil
	case errors.Is(err, zk.ErrNoAuth) && d.digest != "" && grants(d.acl, d.digest, zk.PermRead|zk.PermAdmin):
		user, _, _ := strings.Cut(d.digest, ":")
		return fmt.Errorf("%w: cannot read the ACL of %s: wrong password, or the node's ACL does not give the digest user %s READ", backend.ErrPermission, path, user)
	case errors.Is(err, zk.ErrNoAuth):
		return fmt.Errorf("%w: cannot read the ACL of %s (it needs the READ or ADMIN permission for our identity)", backend.ErrPermission, path)
	case err != nil:
		return fmt.Errorf("read the ACL of %s: %w", path, err)
	}
	if sameACL(acl, d.acl) {
		return nil
	}
	if user, ok := otherPassword(acl, d.acl); ok {
		return fmt.Errorf("%w: the ACL of %s names the digest user %s with another password: wrong password", backend.ErrPermission, path, user)
	}
	return fmt.Errorf("%w: %s has the ACL %s, not the configured %s, so others may delete or squat on a holder's node: set its ACL (zkCli: setAcl %s ...) or delete it and let the driver make it",
		backend.ErrPermission, path, formatACL(acl), formatACL(d.acl), path)
}

// masked is the password hash ZooKeeper shows in a digest id to a client
// without the ADMIN permission on the node.
const masked = "x"

// otherPassword reports a digest user of ours that acl names with another
// password hash: most likely a wrong password.
func otherPassword(acl, ours []zk.ACL) (string, bool) {
	for _, o := range ours {
		if o.Scheme != "digest" {
			continue
		}
		user, hash, _ := strings.Cut(o.ID, ":")
		for _, x := range acl {
			u, h, _ := strings.Cut(x.ID, ":")
			if x.Scheme == "digest" && u == user && h != hash && h != masked {
				return user, true
			}
		}
	}
	return "", false
}

// grants reports whether acl gives the digest id (user:hash) perm.
func grants(acl []zk.ACL, id string, perm int32) bool {
	return slices.ContainsFunc(acl, func(x zk.ACL) bool { return x.Scheme == "digest" && x.ID == id && x.Perms&perm != 0 })
}

// checkPerms proves, in one round trip that changes nothing, that our
// identity has the permissions locking needs: a transaction ending in a
// failing version check, rolled back; the first op refused names the
// missing permission (probePerms). A missing root is made.
func (d *Driver) checkPerms(ctx context.Context) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	// '~' is outside backend.EscapeKey's alphabet: no lock name's node.
	probe := d.root + "/~probe-" + hex.EncodeToString(b[:])
	bo := newBackoff()
	made := false
	for {
		res, err := d.conn.Multi(
			&zk.CreateRequest{Path: probe, Data: []byte{}, Acl: d.acl},
			&zk.CreateRequest{Path: probe + "/" + nodePrefix, Data: []byte{}, Acl: d.acl, Flags: zk.FlagEphemeral},
			&zk.SetDataRequest{Path: probe, Data: []byte{}, Version: -1},
			&zk.DeleteRequest{Path: probe + "/" + nodePrefix, Version: -1},
			&zk.CheckVersionRequest{Path: probe, Version: math.MaxInt32},
		)
		if len(res) == len(probePerms) {
			i := slices.IndexFunc(res, func(r zk.MultiResponse) bool { return r.Error != nil })
			switch {
			case i < 0:
				_ = d.conn.Delete(probe, -1)
				return fmt.Errorf("check the permissions under %s: the server ran a transaction meant to fail", d.root)
			case i == 4 && errors.Is(res[i].Error, zk.ErrBadVersion):
				return nil
			case i == 0 && errors.Is(res[i].Error, zk.ErrNoNode) && !made:
				if err := d.ensureRoot(); err != nil {
					return err
				}
				// Someone may have made it first, with another ACL.
				if err := d.checkACL(d.root); err != nil {
					return fmt.Errorf("root: %w", err)
				}
				made = true
				continue
			case errors.Is(res[i].Error, zk.ErrNoAuth) && d.digest != "" && grants(d.acl, d.digest, probePerms[i].perm):
				// Our ACL grants it: the server did not take our password.
				user, _, _ := strings.Cut(d.digest, ":")
				return fmt.Errorf("%w: the digest user %s does not have the %s permission that the ACL of %s grants it: wrong password",
					backend.ErrPermission, user, probePerms[i].name, d.root)
			case errors.Is(res[i].Error, zk.ErrNoAuth):
				return fmt.Errorf("%w: the ACL %s does not give this client's identity the %s permission, which locking needs %s",
					backend.ErrPermission, formatACL(d.acl), probePerms[i].name, probePerms[i].where)
			default:
				return fmt.Errorf("check the permissions under %s: %w", d.root, res[i].Error)
			}
		}
		if err == nil || !transient(err) || !bo.Pause(ctx) {
			return fmt.Errorf("check the permissions under %s: %w", d.root, err)
		}
	}
}

// probePerms: what each operation of checkPerms's transaction needs.
var probePerms = [5]struct {
	perm        int32
	name, where string
}{
	{zk.PermCreate, "CREATE", "on the root (to make a name's node)"},
	{zk.PermCreate, "CREATE", "on a name's node (to queue)"},
	{zk.PermWrite, "WRITE", "on a name's node (to read the fence)"},
	{zk.PermDelete, "DELETE", "on a name's node (to release)"},
	{zk.PermRead, "READ", "on a name's node (to list and watch the queue)"},
}

// sameACL compares a node's ACL, as shown, with ours. A masked digest id
// matches any password of its user: checkPerms finds a wrong one.
func sameACL(node, ours []zk.ACL) bool {
	key := func(x zk.ACL) string { return fmt.Sprintf("%d %s %s", x.Perms, x.Scheme, x.ID) }
	ka, kb := make([]string, len(node)), make([]string, len(ours))
	for i, x := range node {
		ka[i] = key(x)
	}
	for i, x := range ours {
		if user, _, _ := strings.Cut(x.ID, ":"); x.Scheme == "digest" && slices.ContainsFunc(node, func(n zk.ACL) bool {
			return n.Scheme == "digest" && n.ID == user+":"+masked
		}) {
			x.ID = user + ":" + masked
		}
		kb[i] = key(x)
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// formatACL writes an ACL as zkCli does, without password hashes.
func formatACL(acl []zk.ACL) string {
	parts := make([]string, len(acl))
	for i, x := range acl {
		id := x.ID
		if x.Scheme == "digest" {
			id, _, _ = strings.Cut(id, ":")
		}
		parts[i] = x.Scheme + ":" + id + ":" + perms(x.Perms)
	}
	return strings.Join(parts, ",")
}

func perms(p int32) string {
	var b strings.Builder
	for i, bit := range []int32{zk.PermCreate, zk.PermDelete, zk.PermRead, zk.PermWrite, zk.PermAdmin} {
		if p&bit != 0 {
			b.WriteByte("cdrwa"[i])
		}
	}
	return b.String()
}
