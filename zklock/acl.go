package zklock

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// The nodes a lock lives under decide who can delete a holder's node or
// squat on a name: deleting a child takes the parent's delete permission,
// and creating one its create permission. The driver makes the root and
// the name nodes with the configured ACL; one that someone else made first
// (zkCli's `create /locks` is world-writable) may let anyone in. So a root
// or name node that existed before the driver needed it must carry exactly
// the configured ACL, or the driver refuses to lock under it, with an error
// that says how to fix it.

// checkACL returns an error wrapping ErrPermission when the node at path
// exists with another ACL than the configured one; nil when it has that
// ACL or does not exist.
func (d *Driver) checkACL(path string) error {
	acl, _, err := d.conn.GetACL(path)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil
	case errors.Is(err, zk.ErrNoAuth):
		return fmt.Errorf("%w: cannot read the ACL of %s (it needs the READ or ADMIN permission for our identity)", backend.ErrPermission, path)
	case err != nil:
		return fmt.Errorf("read the ACL of %s: %w", path, err)
	}
	if sameACL(acl, d.acl) {
		return nil
	}
	return fmt.Errorf("%w: %s has the ACL %s, not the configured %s, so others may delete or squat on a holder's node: set its ACL (zkCli: setAcl %s ...) or delete it and let the driver make it",
		backend.ErrPermission, path, formatACL(acl), formatACL(d.acl), path)
}

func sameACL(a, b []zk.ACL) bool {
	key := func(x zk.ACL) string { return fmt.Sprintf("%d %s %s", x.Perms, x.Scheme, x.ID) }
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i, x := range a {
		ka[i] = key(x)
	}
	for i, x := range b {
		kb[i] = key(x)
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// formatACL writes an ACL as zkCli does, with a digest's password hash
// left out: scheme:id:perms.
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
	for _, c := range []struct {
		bit  int32
		char byte
	}{{zk.PermCreate, 'c'}, {zk.PermDelete, 'd'}, {zk.PermRead, 'r'}, {zk.PermWrite, 'w'}, {zk.PermAdmin, 'a'}} {
		if p&c.bit != 0 {
			b.WriteByte(c.char)
		}
	}
	return b.String()
}
