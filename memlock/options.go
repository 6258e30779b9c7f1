package memlock

// config is what the options set. The in-process store has nothing to
// tune yet: Option exists so that New and Open have the same form as every
// other backend's, and can grow options without breaking callers.
type config struct{}

// Option configures a Driver made with New or Open.
type Option func(*config)
