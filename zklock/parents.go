package zklock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

func (d *Driver) parentPath(key string) string { return d.root + "/" + backend.EscapeKey(key) }

// makeParent creates the node of a name, which may be missing, as a
// container node with the driver's ACL (and the root when it is missing);
// true if this call made it.
func (d *Driver) makeParent(parent string) bool {
	for range 2 {
		_, err := request(d, func() (string, error) {
			return d.conn.CreateContainer(parent, []byte{}, zk.FlagContainer, d.acl)
		})
		if !errors.Is(err, zk.ErrNoNode) {
			return err == nil
		}
		if d.ensureRoot() != nil {
			return false
		}
	}
	return false
}

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

// ensureParent creates the container node parent, and the root if needed.
func (d *Driver) ensureParent(parent string) error {
	for range 2 {
		_, err := d.conn.CreateContainer(parent, []byte{}, zk.FlagContainer, d.acl)
		switch {
		case err == nil, errors.Is(err, zk.ErrNodeExists):
			return nil
		case errors.Is(err, zk.ErrNoNode):
			if err := d.ensureRoot(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("create %s: %w", parent, err)
		}
	}
	return fmt.Errorf("create %s: %w", parent, zk.ErrNoNode)
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
