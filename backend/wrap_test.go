package backend_test

import (
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

type plain struct{ backend.Driver }

type session struct{ plain }

func (session) SessionTTL() time.Duration { return time.Second }

type wrapper struct{ backend.Driver }

func (w wrapper) Unwrap() backend.Driver { return w.Driver }

type sessionWrapper struct{ wrapper }

func (sessionWrapper) SessionTTL() time.Duration { return time.Minute }

type loop struct{ plain }

func (l *loop) Unwrap() backend.Driver { return l }

func TestAsFindsThroughWrappers(t *testing.T) {
	s, ok := backend.As[backend.Session](wrapper{wrapper{session{}}})
	if !ok || s.SessionTTL() != time.Second {
		t.Fatalf("As through two wrappers = %v, %v; want the inner Session", s, ok)
	}
	// A wrapper that implements the interface itself comes first.
	if s, _ := backend.As[backend.Session](sessionWrapper{wrapper{session{}}}); s.SessionTTL() != time.Minute {
		t.Fatal("As skipped a wrapper that implements the interface")
	}
	if _, ok := backend.As[backend.Queuer](wrapper{session{}}); ok {
		t.Fatal("As found a Queuer nobody implements")
	}
	if _, ok := backend.As[backend.Session](wrapper{nil}); ok {
		t.Fatal("As found something in a nil chain")
	}
	if _, ok := backend.As[backend.Queuer](&loop{}); ok {
		t.Fatal("As found something in a looping chain")
	}
}
