package parallel

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestEach(t *testing.T) {
	for _, limit := range []int{0, 1, 3, 50} {
		var mu sync.Mutex
		running, most := 0, 0
		errs := Each(20, limit, func(i int) error {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
			if i%2 == 1 {
				return fmt.Errorf("odd %d", i)
			}
			return nil
		})
		if most > max(limit, 1) {
			t.Errorf("limit %d: %d ran at once", limit, most)
		}
		if len(errs) != 20 {
			t.Fatalf("limit %d: %d errors, want one per i", limit, len(errs))
		}
		for i, err := range errs {
			if want := fmt.Sprintf("odd %d", i); (i%2 == 1) != (err != nil) || err != nil && err.Error() != want {
				t.Errorf("limit %d: errs[%d] = %v", limit, i, err)
			}
		}
	}
	if errs := Each(0, 0, func(int) error { return errors.New("called") }); len(errs) != 0 {
		t.Errorf("Each(0) = %v", errs)
	}
}

func TestWait(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	start := time.Now()
	if Wait(&wg, 20*time.Millisecond) || time.Since(start) < 20*time.Millisecond {
		t.Errorf("Wait on a busy group: true, or gave up after %v < 20ms", time.Since(start))
	}
	if Wait(&wg, 0) || Wait(&wg, -time.Second) {
		t.Error("Wait(d <= 0) on a busy group = true")
	}
	time.AfterFunc(10*time.Millisecond, wg.Done)
	if !Wait(&wg, 5*time.Second) {
		t.Error("Wait gave up on a group done in 10ms")
	}
	ch := make(chan struct{})
	close(ch)
	if !Within(ch, time.Second) {
		t.Error("Within a closed channel = false")
	}
}
