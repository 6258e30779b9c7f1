package backend

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestOpenNamesTheMissingImport(t *testing.T) {
	for scheme, want := range map[string]string{"postgres": "sqllock", "rediss+quorum": "redislock", "nosuch": "registered"} {
		_, err := Open(t.Context(), &url.URL{Scheme: scheme, Host: "h"})
		if !errors.Is(err, ErrInvalidURL) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%s://) = %v, want ErrInvalidURL naming %s", scheme, err, want)
		}
	}
}

func TestParseURL(t *testing.T) {
	if u, err := ParseURL("x://h/p", "y", "x"); err != nil || u.Host != "h" {
		t.Errorf("ParseURL = %v, %v", u, err)
	}
	for _, raw := range []string{"x://u:Secret@h:bad port/", "z://h"} {
		_, err := ParseURL(raw, "x")
		if !errors.Is(err, ErrInvalidURL) || strings.Contains(err.Error(), "Secret") {
			t.Errorf("ParseURL(%q) = %v, want ErrInvalidURL without the URL", raw, err)
		}
	}
}
