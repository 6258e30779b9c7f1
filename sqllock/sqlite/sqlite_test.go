package sqlite

import (
	"context"
	"testing"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// The suite on one database file, every driver opened from its URL.
func TestConformance(t *testing.T) {
	conformance.Run(t, sqltest.NewSQLite(t, func(ctx context.Context, path string) (backend.Driver, error) {
		return Open(ctx, "sqlite://"+path)
	}))
}
