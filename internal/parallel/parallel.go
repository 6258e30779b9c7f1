// Package parallel runs the iterations of a loop at once, a bounded number
// at a time.
package parallel

import "sync"

// Each runs f(i) for every i below n, at most limit (at least one) at a
// time, and returns their errors, by i.
func Each(n, limit int, f func(i int) error) []error {
	errs := make([]error, n)
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errs
}
