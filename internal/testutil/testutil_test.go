package testutil

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestRandHex(t *testing.T) {
	a, b := RandHex(4), RandHex(4)
	if len(a) != 8 || a == b {
		t.Errorf("RandHex(4) = %q then %q, want 8 hex digits, different", a, b)
	}
	if len(Token()) != 32 {
		t.Errorf("Token() = %q, want 32 hex digits", Token())
	}
}

func TestSyncBuffer(t *testing.T) {
	var buf SyncBuffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprintf(&buf, "%d\n", i)
				_ = buf.String()
			}
		})
	}
	wg.Wait()
	if n := strings.Count(buf.String(), "\n"); n != 800 {
		t.Errorf("%d lines, want 800", n)
	}
	buf.Reset()
	if buf.String() != "" {
		t.Errorf("after Reset: %q", buf.String())
	}
}
