// Package parallel runs the iterations of a loop at once, a bounded number
// at a time, and waits for goroutines a bounded time.
package parallel

import (
	"sync"
	"time"
)

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

// Wait waits for wg, at most d; false if it gave up (none when d <= 0: no
// goroutine is left waiting).
func Wait(wg *sync.WaitGroup, d time.Duration) bool {
	if d <= 0 {
		return false
	}
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return Within(ch, d)
}

// Within waits for ch, at most d; false if it gave up.
func Within(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
