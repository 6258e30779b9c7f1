package locker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
)

// Token is a holder's secret: 128 random bits as 32 hex digits. Its String
// and LogValue show only a prefix, so printing or logging a Token never
// reveals it; string(tok) gives the whole value.
type Token string

// String returns the first 8 hex digits and an ellipsis.
func (t Token) String() string {
	if len(t) <= 8 {
		return "…"
	}
	return string(t[:8]) + "…"
}

// GoString is String, so %#v does not reveal the token either.
func (t Token) GoString() string { return t.String() }

// LogValue implements slog.LogValuer with the shortened form.
func (t Token) LogValue() slog.Value { return slog.StringValue(t.String()) }

// newToken reads 16 bytes from r. A failing source is an error, never a
// weak token.
func newToken(r io.Reader) (string, error) {
	var b [16]byte
	if r == rand.Reader {
		// Never fails (it crashes the program instead), and unlike a read
		// through the interface keeps b off the heap.
		rand.Read(b[:])
	} else if err := readToken(r, &b); err != nil {
		return "", err
	}
	var x [32]byte
	hex.Encode(x[:], b[:])
	return string(x[:]), nil
}

// readToken fills b from r, a source that a test set.
func readToken(r io.Reader, b *[16]byte) error {
	buf := make([]byte, len(b))
	if _, err := io.ReadFull(r, buf); err != nil {
		return fmt.Errorf("locker: random source failed, no token made: %w", err)
	}
	copy(b[:], buf)
	return nil
}
