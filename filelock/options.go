package filelock

// config is what the options set.
type config struct {
	sync bool
}

// Option configures a Driver made with New or Open.
type Option func(*config)

// WithSync turns the fsync after each acquisition on (the default) or off.
// Open's sync= parameter sets it too; an option given to Open wins.
func WithSync(on bool) Option { return func(c *config) { c.sync = on } }
