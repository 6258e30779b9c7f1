package backend

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestOpenNamesTheMissingImport(t *testing.T) {
	for scheme, want := range map[string]string{"postgres": "pglock", "rediss+quorum": "redislock", "nosuch": "imported"} {
		_, err := Open(t.Context(), &url.URL{Scheme: scheme, Host: "h"})
		if !errors.Is(err, ErrInvalidURL) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%s://) = %v, want ErrInvalidURL naming %s", scheme, err, want)
		}
	}
}
