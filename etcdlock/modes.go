package etcdlock

import (
	"fmt"

	"github.com/lockerhq/locker/backend"
)

var _ backend.Modal = (*Driver)(nil)

// Modes implements backend.Modal: semaphores and read-write locks, each a
// queue beside the lock's (see dirs).
func (d *Driver) Modes() backend.ModeSet {
	return backend.Modes(backend.Permit, backend.Read, backend.Write)
}

// Weighs implements backend.Weigher: an entry carries its permits.
func (d *Driver) Weighs() bool { return true }

// The tags that follow the escaped key in the names of a semaphore's and
// a read-write lock's directories.
const (
	semTag = "%s"
	rwTag  = "%r"
)

// tags is the tag of the directory of each object (see dirs).
var tags = map[backend.Mode]string{backend.Exclusive: "", backend.Permit: semTag, backend.Read: rwTag}

// dirs checks l and returns the directory of its entry and the prefix of
// the entries that may be ahead of it. The escaped key followed by '%' and
// a letter is no escaped key (EscapeKey puts two hex digits after '%'), so
// the directories of a name's objects never overlap each other or another
// name's, and List tells them apart.
func (d *Driver) dirs(l backend.Claim) (dir, over string, err error) {
	if _, err := ttlSeconds(l.TTL + l.Delay); err != nil {
		return "", "", err
	}
	tag, ok := tags[backend.Object(l.Mode)]
	if !ok {
		return "", "", fmt.Errorf("%w: mode %v", backend.ErrUnsupported, l.Mode)
	}
	dir = d.dir(l.Key, tag)
	switch l.Mode {
	case backend.Permit:
		if l.Limit < 1 || l.Limit > backend.MaxLimit || l.Weight > l.Limit {
			return "", "", fmt.Errorf("%w: %d of %d permits (want 1 to %d of 1 to %d)", backend.ErrInvalidLimit, max(l.Weight, 1), l.Limit, l.Limit, backend.MaxLimit)
		}
	case backend.Read:
		// A reader waits for the writers ahead of it alone.
		return dir + "r/", dir + "w/", nil
	case backend.Write:
		// A writer waits for every entry ahead of it.
		return dir + "w/", dir, nil
	}
	return dir, dir, nil
}

// dir is the directory of key's object of tag (see dirs).
func (d *Driver) dir(key, tag string) string {
	return d.prefix + "/" + backend.EscapeKey(key) + tag + "/"
}
