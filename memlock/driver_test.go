package memlock_test

import (
	"errors"
	"testing"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// A nil Store is a bad argument, reported as every driver reports a nil
// client: an error wrapping backend.ErrInvalidOption, so permanent.
func TestNewNilStore(t *testing.T) {
	d, err := memlock.New(nil)
	if d != nil || !errors.Is(err, backend.ErrInvalidOption) {
		t.Fatalf("New(nil) = %v, %v; want nil, an error wrapping backend.ErrInvalidOption", d, err)
	}
	if !backend.Permanent(err) {
		t.Fatalf("New(nil) error %v is not permanent", err)
	}
}
