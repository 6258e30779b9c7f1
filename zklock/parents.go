package zklock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

func (d *Driver) parentPath(key string) string { return d.root + "/" + backend.EscapeKey(key) }

// maxParents bounds the driver's memory of names whose node exists.
const maxParents = 8192

func (d *Driver) knownParent(parent string) bool {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	_, ok := d.parents[parent]
	return ok
}

func (d *Driver) rememberParent(parent string) {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if len(d.parents) >= maxParents {
		clear(d.parents)
	}
	d.parents[parent] = struct{}{}
}

func (d *Driver) forgetParent(parent string) {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	delete(d.parents, parent)
}

// ensureParent creates the container node parent, and the root if
// needed; made is false when it was there already (someone else's, whose
// ACL must be checked).
func (d *Driver) ensureParent(parent string) (made bool, err error) {
	for range 2 {
		_, err := request(d, func() (string, error) {
			return d.conn.CreateContainer(parent, []byte{}, zk.FlagContainer, d.acl)
		})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, zk.ErrNodeExists):
			return false, nil
		case errors.Is(err, zk.ErrNoNode):
			if err := d.ensureRoot(); err != nil {
				return false, err
			}
		default:
			return false, fmt.Errorf("create %s: %w", parent, err)
		}
	}
	return false, fmt.Errorf("create %s: %w", parent, zk.ErrNoNode)
}

// ensureRoot creates the root and its ancestors, as persistent nodes.
func (d *Driver) ensureRoot() error {
	parts := strings.Split(d.root[1:], "/")
	p := ""
	for _, part := range parts {
		p += "/" + part
		_, err := d.conn.Create(p, []byte{}, 0, d.acl)
		switch {
		case errors.Is(err, zk.ErrNoAuth):
			return fmt.Errorf("%w: cannot create %s (for the root %s): the ACL of its parent does not give this client's identity the CREATE permission (create the root with the driver's ACL)", backend.ErrPermission, p, d.root)
		case err != nil && !errors.Is(err, zk.ErrNodeExists):
			return fmt.Errorf("create the root %s: %w", p, err)
		}
	}
	return nil
}
