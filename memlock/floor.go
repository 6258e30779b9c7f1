package memlock

import (
	"context"
	"fmt"

	"github.com/lockerhq/locker/internal/measure"
)

// Registered for internal/bench, out of the driver's API.
func init() { measure.RegisterRawFloor((*Driver).rawFloor) }

// rawFloor puts key in the store if it is absent and deletes it, in two
// steps as a store's two requests would be: the least a lock's
// acquire+release costs here. It tells no subscriber: key is never a
// lock's key.
func (d *Driver) rawFloor(ctx context.Context, key string) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	s := d.s
	s.mu.Lock()
	_, taken := s.locks[key]
	if !taken {
		s.locks[key] = entry{token: "floor"}
	}
	s.mu.Unlock()
	if taken {
		return fmt.Errorf("memlock: raw floor: %q is taken", key)
	}
	s.mu.Lock()
	delete(s.locks, key)
	s.mu.Unlock()
	return nil
}
