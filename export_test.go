package locker

import "io"

// Hooks for the tests of package locker_test. This file is compiled only
// for tests, so none of it is part of the package's API.

// WithRandom replaces crypto/rand as the source of owner tokens.
func WithRandom(r io.Reader) Option { return func(c *config) { c.rand = r } }
