// Package testutil holds the small helpers every backend's tests use: random
// names and tokens, and a log buffer safe for concurrent writers.
package testutil

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"sync"
)

// RandHex returns 2n random hex digits, for names no other test or run uses.
func RandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand.Read crashes the program instead)
	return hex.EncodeToString(b)
}

// Token returns a random lock token of the size the locker package makes.
func Token() string { return RandHex(16) }

// SyncBuffer is a bytes.Buffer that a logger's goroutines may write to while
// the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Reset empties the buffer.
func (s *SyncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}
