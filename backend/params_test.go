package backend

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

// A parameter given twice is refused, whichever copy a reader takes:
// ttl=5s&ttl=6s means nothing certain.
func TestParamsRefuseDuplicates(t *testing.T) {
	u, _ := url.Parse("x://h/?ttl=5s&pool=2&ttl=6s&b=1&b=1")
	p := NewParams(u)
	p.Duration("ttl", time.Second)
	p.Int("pool", 1)
	p.Int("b", 0)
	err := p.Err()
	if !errors.Is(err, ErrInvalidURL) || !strings.Contains(err.Error(), "b, ttl given more than once") {
		t.Errorf("Err = %v, want ErrInvalidURL naming b and ttl", err)
	}
	u, _ = url.Parse("x://h/?ttl=5s&pool=2")
	p = NewParams(u)
	p.Duration("ttl", time.Second)
	p.Int("pool", 1)
	if err := p.Err(); err != nil {
		t.Errorf("Err of parameters given once = %v", err)
	}
}
